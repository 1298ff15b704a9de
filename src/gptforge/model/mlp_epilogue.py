"""The MLP with GELU in its GEMMs' epilogues (``gelu-epilogue = true``; quack-kernels, sm_90/sm_100).

Forward: quack's up-projection GEMM adds the bias and applies GELU in its epilogue, storing the
pre-activation and the activation for the backward; its down-projection GEMM adds the bias. Backward:
one quack GEMM computes dout @ W2 and multiplies by GELU's derivative at the stored pre-activation in its
epilogue. (Keeping the activation costs 2 bytes x 4C a token of memory and spares that GEMM writing a
recomputed one: at K = C = 768 its epilogue's traffic is what it waits on.) The other GEMMs of the backward
come from cuBLAS. The up-projection's bias gradient is summed in that GEMM's epilogue too, or with
BIAS_FROM_GEMM (``mlp-bias-gemm = true``) it comes out of the weight-gradient GEMM, as in model/bias_gemm.py:
the input gets columns of ones beside it in the forward (under torch.compile the LayerNorm before it writes
them), so dpreactᵀ · [x | 1] is [dW1 | db1] and the GELU GEMM's epilogue does less (BENCHMARKS.md, runs
93-100: +0.42% at width 768, +0.2% at 1024). Operands are the autocast dtype's (the caller casts);
gradients come back in it, as nn.Linear's do under autocast.
"""

from __future__ import annotations

import torch
from quack.activation import dgelu_tanh_approx
from quack.epilogue.frontend import gemm_epilogue
from quack.epilogue.library import dgelu_dbias_epi
from quack.gemm_interface import gemm, gemm_act
from torch import Tensor

from gptforge.model.bias_gemm import with_ones

GELU = "gelu_tanh_approx"


@gemm_epilogue()
def _dgelu_epilogue(acc, c):
    """acc = dout @ W2 (the activation's gradient), c = the pre-activation: D = its gradient."""
    dpreact, _ = dgelu_tanh_approx(c, acc)
    return {"D": dpreact}


@torch.library.custom_op("gptforge::dgelu", mutates_args=(), device_types="cuda")
def dgelu(dout: Tensor, w2: Tensor, preact: Tensor) -> Tensor:
    """d preact from dout (M, C), W2 (C, 4C) and the pre-activation (M, 4C)."""
    return _dgelu_epilogue(dout, w2, preact, tuned=True, dynamic_scheduler=True)["D"]


@dgelu.register_fake
def _(dout: Tensor, w2: Tensor, preact: Tensor) -> Tensor:
    return torch.empty_like(preact)


@torch.library.custom_op("gptforge::dgelu_dbias", mutates_args=(), device_types="cuda")
def dgelu_dbias(dout: Tensor, w2: Tensor, preact: Tensor) -> tuple[Tensor, Tensor]:
    """(d preact, d bias1) from dout (M, C), W2 (C, 4C) and the pre-activation (M, 4C)."""
    res = dgelu_dbias_epi(dout, w2, preact, tuned=True, dynamic_scheduler=True)
    return res["D"], res["dwb"].reshape(-1).to(preact.dtype)


@dgelu_dbias.register_fake
def _(dout: Tensor, w2: Tensor, preact: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(preact), preact.new_empty(preact.shape[-1])


class EpilogueMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, bias_from_gemm: bool) -> Tensor:
        width = x.shape[-1]
        rows = with_ones(x.reshape(-1, width)) if bias_from_gemm else x.reshape(-1, width)
        preact, postact = gemm_act(rows[:, :width], w1.T, bias=b1, activation=GELU, store_preact=True)
        out = gemm(postact, w2.T, bias=b2)
        ctx.save_for_backward(rows, w1, w2, preact, postact)
        ctx.bias_from_gemm = bias_from_gemm
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, dout: Tensor):
        rows, w1, w2, preact, postact = ctx.saved_tensors
        width = w1.shape[1]
        dout_rows = dout.reshape(-1, dout.shape[-1]).contiguous()
        if ctx.bias_from_gemm:  # rows = [x | 1]: column `width` of the weight gradient sums dpreact over the tokens
            dpreact = dgelu(dout_rows, w2, preact)
            weight_and_bias = dpreact.t() @ rows
            dw1, db1 = weight_and_bias[:, :width], weight_and_bias[:, width]
        else:
            dpreact, db1 = dgelu_dbias(dout_rows, w2, preact)
            dw1 = dpreact.t() @ rows
        dx = (dpreact @ w1).view(*dout.shape[:-1], width)
        return dx, dw1, db1, dout_rows.t() @ postact, dout_rows.sum(0), None


def epilogue_mlp(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, bias_from_gemm: bool = False) -> Tensor:
    """GELU MLP of x with up-projection (w1, b1) and down-projection (w2, b2), each in nn.Linear's layout;
    BIAS_FROM_GEMM: b1's gradient from the weight-gradient GEMM (else from the GELU GEMM's epilogue)."""
    return EpilogueMLP.apply(x, w1, b1, w2, b2, bias_from_gemm)
