"""The MLP with GELU in its GEMMs' epilogues (quack-kernels, sm_90), in place of the model's ``MLP``.

Forward: quack's up-projection GEMM adds the bias and applies GELU in its epilogue, storing the
pre-activation and the activation for the backward; its down-projection GEMM adds the bias. Backward:
one quack GEMM computes dout @ W2, multiplies by GELU's derivative at the stored pre-activation and sums
the up-projection's bias gradient in its epilogue. (Keeping the activation costs 2 bytes x 4C a token of
memory and spares that GEMM writing a recomputed one: at K = C = 768 its epilogue's traffic is what it waits
on.) The other GEMMs of the backward come from cuBLAS. Operands are the autocast dtype's; gradients come
back in it, as nn.Linear's do under autocast.
"""

from __future__ import annotations

import torch
from quack.epilogue.library import dgelu_dbias_epi
from quack.gemm_interface import gemm, gemm_act
from torch import Tensor, nn

from gptforge.accel.attention import autocast_dtype

GELU = "gelu_tanh_approx"


@torch.library.custom_op("gptforge::dgelu_dbias", mutates_args=(), device_types="cuda")
def dgelu_dbias(dout: Tensor, w2: Tensor, preact: Tensor) -> tuple[Tensor, Tensor]:
    """(d preact, d bias1) from dout (M, C), W2 (C, 4C) and the pre-activation (M, 4C)."""
    res = dgelu_dbias_epi(dout, w2, preact, tuned=True, dynamic_scheduler=True)
    return res["D"], res["dwb"].reshape(-1).to(preact.dtype)


@dgelu_dbias.register_fake
def _(dout: Tensor, w2: Tensor, preact: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(preact), preact.new_empty(preact.shape[-1])


class _EpilogueMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
        rows = x.reshape(-1, x.shape[-1])
        preact, postact = gemm_act(rows, w1.T, bias=b1, activation=GELU, store_preact=True)
        out = gemm(postact, w2.T, bias=b2)
        ctx.save_for_backward(rows, w1, w2, preact, postact)
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, dout: Tensor):
        rows, w1, w2, preact, postact = ctx.saved_tensors
        dout_rows = dout.reshape(-1, dout.shape[-1]).contiguous()
        dpreact, db1 = dgelu_dbias(dout_rows, w2, preact)
        dx = (dpreact @ w1).view(*dout.shape[:-1], w1.shape[1])
        return dx, dpreact.t() @ rows, db1, dout_rows.t() @ postact, dout_rows.sum(0)


def epilogue_mlp(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    """GELU MLP of x with up-projection (w1, b1) and down-projection (w2, b2), each in nn.Linear's layout."""
    return _EpilogueMLP.apply(x, w1, b1, w2, b2)


class EpilogueMLP(nn.Module):
    """The model's MLP (its fc and proj layers, their weights and names) through quack's GEMMs."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.fc, self.proj, self.dropout = mlp.fc, mlp.proj, mlp.dropout

    def forward(self, x: Tensor) -> Tensor:
        operands = (autocast_dtype(t) for t in (x, self.fc.weight, self.fc.bias, self.proj.weight, self.proj.bias))
        return self.dropout(epilogue_mlp(*operands))
