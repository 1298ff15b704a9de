"""The residual add and the LayerNorm after it, in one pass each way: ``AddLayerNorm`` and its custom ops.

For the residual stream RES (float32) and the branch output DELTA (none before the first LayerNorm):
res_out = res + delta and y = LayerNorm(res_out) * weight + bias (eps as nn.LayerNorm's), y in the
autocast dtype under CUDA autocast (it only feeds matmuls), else in res's. On CUDA a Triton kernel makes
y, res_out and each row's mean and 1/std in one read of res and delta; the backward kernel reads x
(res_out), dy and the incoming gradient of res_out once, writes the gradient of res (float32) and of
delta (in delta's dtype) in the same pass and sums the weight and bias gradients per program as it
goes, so no second pass over x and dy makes those column sums. Elsewhere (and for float64) the same
functions run as torch ops: the reference the kernels are tested against.

Custom ops may not return a tensor that aliases an input, so with no delta (res_out is res itself)
the plain ``layer_norm_*`` ops run, and the ``add_layer_norm_*`` ones otherwise.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

MAX_WIDTH = 8192  # a row is one block of the kernels
PROGRAMS_PER_SM = 4  # backward programs, each summing the weight and bias gradients of its run of rows
BACKWARD_ROWS = 2  # rows the backward kernel takes a step (H100, width 768: 2 beat 1, 4 and 8)
CPU_PROGRAMS = 4  # the same under Triton's interpreter, which has no SMs


@functools.cache
def _kernels():
    """The forward and backward Triton kernels, compiled on first use (None when Triton is not importable)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def forward(res_ptr, delta_ptr, res_out_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, width, eps,
                HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < width
        at = row * width + cols
        x = tl.load(res_ptr + at, mask=mask, other=0.0).to(tl.float32)
        if HAS_DELTA:
            x += tl.load(delta_ptr + at, mask=mask, other=0.0).to(tl.float32)
            x = x.to(res_out_ptr.dtype.element_ty)  # normalise what is stored, as the torch add would
            tl.store(res_out_ptr + at, x, mask=mask)
            x = x.to(tl.float32)
        mean = tl.sum(x, 0) / width
        centred = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, 0) / width + eps)
        w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask).to(tl.float32)
        tl.store(y_ptr + at, (centred * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)

    @triton.jit
    def backward(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, d_res_ptr, dx_ptr, d_delta_ptr, dw_ptr, db_ptr,
                 rows, width, rows_per_program, programs, HAS_D_RES: tl.constexpr, HAS_D_DELTA: tl.constexpr,
                 ROWS: tl.constexpr, BLOCK: tl.constexpr):
        program = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        in_row = cols < width
        w = tl.load(w_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK], tl.float32)
        db = tl.zeros([BLOCK], tl.float32)
        first = program * rows_per_program
        last = tl.minimum(first + rows_per_program, rows)
        for start in tl.range(first, last, ROWS):  # ROWS rows a step: more loads in flight
            row = start + tl.arange(0, ROWS)
            mask = (row < last)[:, None] & in_row[None, :]
            at = row.to(tl.int64)[:, None] * width + cols[None, :]
            x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + at, mask=mask, other=0.0).to(tl.float32)
            mean = tl.load(mean_ptr + row, mask=row < last, other=0.0)[:, None]
            rstd = tl.load(rstd_ptr + row, mask=row < last, other=0.0)[:, None]
            x_hat = tl.where(mask, (x - mean) * rstd, 0.0)
            w_dy = w[None, :] * dy
            dx = (w_dy - x_hat * (tl.sum(x_hat * w_dy, 1) / width)[:, None] - (tl.sum(w_dy, 1) / width)[:, None]) * rstd
            if HAS_D_RES:
                dx += tl.load(d_res_ptr + at, mask=mask, other=0.0).to(tl.float32)
            tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            if HAS_D_DELTA:
                tl.store(d_delta_ptr + at, dx.to(d_delta_ptr.dtype.element_ty), mask=mask)
            dw += tl.sum(dy * x_hat, 0)
            db += tl.sum(dy, 0)
        # (width, programs): the sum over programs afterwards reads rows, which torch reduces fast
        tl.store(dw_ptr + cols * programs + program, dw, mask=in_row)
        tl.store(db_ptr + cols * programs + program, db, mask=in_row)

    return forward, backward


def triton_available() -> bool:
    return _kernels() is not None


def _on_triton(x: Tensor) -> bool:
    """Whether the kernels take X: on CUDA, a row in one block, 16 or 32 bits (they compute in float32)."""
    return (x.is_cuda and x.shape[-1] <= MAX_WIDTH and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and triton_available())


def _block(width: int) -> tuple[int, int]:
    """Columns per block (the width rounded up to a power of two) and the warps that hold them."""
    block = 1 << (width - 1).bit_length()
    return block, min(max(block // 256, 1), 8)


def _rows(t: Tensor) -> Tensor:
    return t.reshape(-1, t.shape[-1]).contiguous()


def _wide(t: Tensor) -> torch.dtype:
    """The dtype the statistics are computed in: float32, or float64 for float64 inputs."""
    return torch.promote_types(t.dtype, torch.float32)


def _sum_dtype(res: Tensor, delta: Tensor | None) -> torch.dtype:
    return res.dtype if delta is None else torch.promote_types(res.dtype, delta.dtype)


# ---- forward: Triton and torch -----------------------------------------------------------------------------

def forward_triton(res: Tensor, delta: Tensor | None, weight: Tensor, bias: Tensor, eps: float,
                   out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(y, res_out, mean, rstd) by the forward kernel; res_out is res itself when DELTA is None."""
    x = _rows(res)
    rows, width = x.shape
    res_out = res if delta is None else torch.empty(res.shape, dtype=_sum_dtype(res, delta), device=res.device)
    y = torch.empty(res.shape, dtype=out_dtype, device=res.device)
    mean, rstd = (x.new_empty(rows, dtype=torch.float32) for _ in range(2))
    block, warps = _block(width)
    if rows:
        _kernels()[0][(rows,)](x, x if delta is None else _rows(delta), res_out, weight, bias, y, mean, rstd, width,
                               eps, HAS_DELTA=delta is not None, BLOCK=block, num_warps=warps)
    return y, res_out, mean, rstd


def forward_torch(res: Tensor, delta: Tensor | None, weight: Tensor, bias: Tensor, eps: float,
                  out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(y, res_out, mean, rstd) as torch ops, statistics flat per row in float32 (float64 for float64 inputs)."""
    res_out = res if delta is None else res + delta
    x = _rows(res_out).to(_wide(res_out))
    mean = x.mean(1)
    centred = x - mean[:, None]
    rstd = torch.rsqrt((centred * centred).mean(1) + eps)
    y = centred * rstd[:, None] * weight + bias
    return y.to(out_dtype).view(res.shape), res_out, mean, rstd


def _forward(res, delta, weight, bias, eps, out_dtype):
    if _on_triton(res):
        return forward_triton(res, delta, weight, bias, eps, out_dtype)
    return forward_torch(res, delta, weight, bias, eps, out_dtype)


# ---- backward: Triton and torch ----------------------------------------------------------------------------

def backward_programs(rows: int, device: torch.device) -> tuple[int, int]:
    """(programs, rows per program) of the backward kernel: a few programs per SM, each a contiguous run of rows."""
    most = (torch.cuda.get_device_properties(device).multi_processor_count * PROGRAMS_PER_SM
            if device.type == "cuda" else CPU_PROGRAMS)
    per_program = max(1, -(-rows // most))
    return -(-rows // per_program), per_program


def backward_triton(dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor, d_res: Tensor | None,
                    delta_dtype: torch.dtype | None) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
    """(dx, d_delta, dw, db) by the backward kernel; d_delta (dx in DELTA_DTYPE) only when that is given."""
    flat = _rows(x)
    rows, width = flat.shape
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    d_delta = None if delta_dtype is None else torch.empty_like(dx, dtype=delta_dtype)
    programs, per_program = backward_programs(rows, x.device)
    partial = flat.new_empty(2, width, programs, dtype=torch.float32)  # dw and db of each program's rows
    block, warps = _block(width)
    if rows:
        _kernels()[1][(programs,)](_rows(dy), flat, weight, mean, rstd, flat if d_res is None else _rows(d_res), dx,
                                   dx if d_delta is None else d_delta, partial[0], partial[1], rows, width, per_program,
                                   programs, HAS_D_RES=d_res is not None, HAS_D_DELTA=d_delta is not None,
                                   ROWS=BACKWARD_ROWS, BLOCK=block, num_warps=warps)
    dw, db = (p.sum(1).to(weight.dtype) for p in partial)  # two tensors: an op's outputs may not share storage
    return dx, d_delta, dw, db


def backward_torch(dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor, d_res: Tensor | None,
                   delta_dtype: torch.dtype | None) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
    """(dx, d_delta, dw, db) as torch ops: dx = rstd·(w·dy − mean(w·dy) − x̂·mean(x̂·w·dy)) + d_res."""
    dy_rows = _rows(dy).to(mean.dtype)
    x_hat = (_rows(x).to(mean.dtype) - mean[:, None]) * rstd[:, None]
    w_dy = dy_rows * weight
    dx = (w_dy - x_hat * (x_hat * w_dy).mean(1, keepdim=True) - w_dy.mean(1, keepdim=True)) * rstd[:, None]
    dx = dx.view(x.shape)
    if d_res is not None:
        dx = dx + d_res
    dx = dx.to(x.dtype)
    d_delta = None if delta_dtype is None else dx.to(delta_dtype, copy=True)  # never dx itself: outputs may not alias
    return dx, d_delta, (dy_rows * x_hat).sum(0).to(weight.dtype), dy_rows.sum(0).to(weight.dtype)


def _backward(dy, x, weight, mean, rstd, d_res, delta_dtype):
    if _on_triton(x):
        return backward_triton(dy, x, weight, mean, rstd, d_res, delta_dtype)
    return backward_torch(dy, x, weight, mean, rstd, d_res, delta_dtype)


# ---- the custom ops ------------------------------------------------------------------------------------------

def _stats_fake(x: Tensor) -> tuple[Tensor, Tensor]:
    rows = x.numel() // x.shape[-1]
    return tuple(x.new_empty(rows, dtype=_wide(x)) for _ in range(2))


@torch.library.custom_op("gptforge::layer_norm_fwd", mutates_args=())
def layer_norm_fwd(x: Tensor, weight: Tensor, bias: Tensor, eps: float,
                   out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """(y, mean, rstd) of LayerNorm(x) * weight + bias, y in OUT_DTYPE."""
    y, _, mean, rstd = _forward(x, None, weight, bias, eps, out_dtype)
    return y, mean, rstd


@layer_norm_fwd.register_fake
def _(x, weight, bias, eps, out_dtype):
    return (torch.empty_like(x, dtype=out_dtype, memory_format=torch.contiguous_format), *_stats_fake(x))


@torch.library.custom_op("gptforge::add_layer_norm_fwd", mutates_args=())
def add_layer_norm_fwd(res: Tensor, delta: Tensor, weight: Tensor, bias: Tensor, eps: float,
                       out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(y, res_out, mean, rstd) of res_out = res + delta and y = LayerNorm(res_out) * weight + bias."""
    return _forward(res, delta, weight, bias, eps, out_dtype)


@add_layer_norm_fwd.register_fake
def _(res, delta, weight, bias, eps, out_dtype):
    res_out = torch.empty_like(res, dtype=_sum_dtype(res, delta), memory_format=torch.contiguous_format)
    return (torch.empty_like(res_out, dtype=out_dtype), res_out, *_stats_fake(res_out))


@torch.library.custom_op("gptforge::layer_norm_bwd", mutates_args=())
def layer_norm_bwd(dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor,
                   d_res: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dw, db): LayerNorm's gradients, D_RES (the gradient x also gets as the residual stream) added to dx."""
    dx, _, dw, db = _backward(dy, x, weight, mean, rstd, d_res, None)
    return dx, dw, db


@layer_norm_bwd.register_fake
def _(dy, x, weight, mean, rstd, d_res):
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(weight), torch.empty_like(weight)


@torch.library.custom_op("gptforge::add_layer_norm_bwd", mutates_args=())
def add_layer_norm_bwd(dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor, d_res: Tensor | None,
                       delta_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, d_delta, dw, db) as ``layer_norm_bwd``, and dx once more in DELTA_DTYPE from the same pass."""
    return _backward(dy, x, weight, mean, rstd, d_res, delta_dtype)


@add_layer_norm_bwd.register_fake
def _(dy, x, weight, mean, rstd, d_res, delta_dtype):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    return dx, torch.empty_like(dx, dtype=delta_dtype), torch.empty_like(weight), torch.empty_like(weight)


def _save_layer_norm(ctx, inputs, output):
    x, weight, *_ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)


def _layer_norm_grad(ctx, dy, _d_mean, _d_rstd):
    dx, dw, db = layer_norm_bwd(dy, *ctx.saved_tensors, None)
    return dx, dw, db, None, None


def _save_add_layer_norm(ctx, inputs, output):
    _, delta, weight, *_ = inputs
    _, res_out, mean, rstd = output
    ctx.save_for_backward(res_out, weight, mean, rstd)
    ctx.delta_dtype = delta.dtype


def _add_layer_norm_grad(ctx, dy, d_res, _d_mean, _d_rstd):
    x = ctx.saved_tensors[0]
    if ctx.delta_dtype == x.dtype:  # one gradient serves res and delta alike, as for any add
        dx, dw, db = layer_norm_bwd(dy, *ctx.saved_tensors, d_res)
        return dx, dx, dw, db, None, None
    dx, d_delta, dw, db = add_layer_norm_bwd(dy, *ctx.saved_tensors, d_res, ctx.delta_dtype)
    return dx, d_delta, dw, db, None, None


layer_norm_fwd.register_autograd(_layer_norm_grad, setup_context=_save_layer_norm)
add_layer_norm_fwd.register_autograd(_add_layer_norm_grad, setup_context=_save_add_layer_norm)


def add_layer_norm(res: Tensor, delta: Tensor | None, weight: Tensor, bias: Tensor,
                   eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """(LayerNorm(res + delta) * weight + bias, res + delta); DELTA None: no add."""
    out_dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else res.dtype
    if delta is None:
        return layer_norm_fwd(res, weight, bias, eps, out_dtype)[0], res
    y, res_out, _, _ = add_layer_norm_fwd(res, delta, weight, bias, eps, out_dtype)
    return y, res_out


class AddLayerNorm(nn.LayerNorm):
    """nn.LayerNorm (same parameters and state_dict) that first adds the pending residual branch."""

    def forward(self, res: Tensor, delta: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return add_layer_norm(res, delta, self.weight, self.bias, self.eps)
