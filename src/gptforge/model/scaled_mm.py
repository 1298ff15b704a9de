"""Per-tensor FP8 casts and the scaled matmul the FP8 output layer is made of.

A tensor t is sent to FP8 as q = t * s with s = max / amax(t) (the whole tensor shares one scale, taken
from its own amax at the time of the cast, so nothing is carried between steps), and a matmul of two
such tensors gives (q_a @ q_b) / (s_a * s_b). On GPUs with FP8 tensor cores (sm_89 and newer) the
matmul is cuBLAS's (``torch._scaled_mm``); elsewhere the same rounded values are multiplied in float32,
so the numerics can be tested on any machine, at no gain in speed.

cuBLAS takes FP8 operands only as row-major A times column-major B with every dimension a multiple of
16: ``fits`` says whether a matmul can go this way.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn  # activations and weights: 3 mantissa bits, up to 448
E5M2 = torch.float8_e5m2  # gradients: 2 mantissa bits, up to 57344, down to 2^-16


def fp8_matmul_gpu(device: torch.device) -> bool:
    """Whether DEVICE has FP8 tensor cores (sm_89 and newer)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def fits(*dims: int) -> bool:
    return all(d % 16 == 0 for d in dims)


def to_e4m3(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(t in E4M3 scaled to its amax, the inverse scale as a float32 scalar tensor)."""
    limit = torch.finfo(E4M3).max
    # the floor keeps the scale finite for an all-zero tensor (0 * inf would be NaN); below it values
    # still fit, they just use less of E4M3's range
    amax = t.detach().abs().amax().float().clamp(min=1e-12)
    scale = limit / amax
    q = (t.detach().float() * scale).clamp(-limit, limit).to(E4M3)
    return q, scale.reciprocal()


def scaled_mm(a: torch.Tensor, b: torch.Tensor, inv_scale_a: torch.Tensor, inv_scale_b: torch.Tensor,
              out_dtype: torch.dtype) -> torch.Tensor:
    """(a * inv_scale_a) @ (b * inv_scale_b) in OUT_DTYPE, for FP8 a (row-major) and b (column-major)."""
    if fp8_matmul_gpu(a.device):
        return torch._scaled_mm(a, b, scale_a=inv_scale_a, scale_b=inv_scale_b, out_dtype=out_dtype)
    return ((a.float() * inv_scale_a) @ (b.float() * inv_scale_b)).to(out_dtype)


def column_major(t: torch.Tensor) -> torch.Tensor:
    """T with the same shape and values, laid out column-major (as cuBLAS wants the FP8 matmul's B)."""
    return t.t().contiguous().t()
