"""GPT-2's MLP (Linear, GELU tanh, Linear) forward + backward: compiled torch against GEMMs with GELU in the epilogue.

    PYTHONPATH=src python3 bench/mlp_epilogue.py                 # 124M (768) and 350M (1024) widths, 32768 tokens
    PYTHONPATH=src python3 bench/mlp_epilogue.py --layer-norm    # each MLP after a LayerNorm, as in the model
    PYTHONPATH=src python3 bench/mlp_epilogue.py --layer-norm --gemms --kernels   # + the backward GEMMs alone, kernel lists

The model's MLP as the trainer runs it — float32 weights and biases, bf16 autocast, torch.compile — against
quack's `mlp_func` (the quack-kernels package): the up-projection's GEMM applies bias and GELU in its
epilogue and stores the pre-activation; in the backward the down-projection's input-gradient GEMM
applies GELU's derivative in its epilogue, so no separate GELU kernels run. Times (CUDA events, after
warm-up and quack's autotuning) forward + backward, the host time to issue one (where it reaches the
GPU time, the MLP is bound by Python and launches, which the trainer's CUDA graphs hide), the sum of its
kernels' durations (the profiler's: what it costs the GPU whichever bound holds; --kernels lists them), and the largest difference of the output and
each gradient from torch's. A third row is gptforge's MLP
(model/mlp_epilogue.py, what gelu-epilogue=true runs): quack's forward GEMMs, the up-projection's bias
gradient summed in the epilogue of the GEMM that applies GELU's derivative, the other GEMMs of the backward
from cuBLAS; a fourth, `gptforge-bias-gemm`, is the same with mlp-bias-gemm=true: that bias gradient from
the up-projection's weight-gradient GEMM (columns of ones beside its input). With
--layer-norm a LayerNorm (float32 gain and bias, as the model's) runs before each MLP, timed with it: the
model's LayerNorm writes the columns of ones in its own kernel, where alone they take a copy of the input.
The variants run one after another (--mlps picks them): on a GPU at its power cap a later one can run slower
even in the kernels it shares with an earlier one (BENCHMARKS.md, run 101), so compare those in --kernels
before reading a difference. A table is printed; JSON goes to $GPTFORGE_BENCH_OUT/mlp_epilogue.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fp8_linear import cuda_ms, kernel_ms, launch_ms, run_gpu_bench  # noqa: E402


def torch_mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)


def quack_mlp(x, w1, b1, w2, b2):
    from quack.mlp import mlp_func

    from gptforge.model.gpt import autocast_dtype

    return mlp_func(x, w1, w2, "gelu_tanh_approx", bias1=autocast_dtype(b1), bias2=autocast_dtype(b2))


def gptforge_mlp(x, w1, b1, w2, b2, bias_from_gemm=False):
    from gptforge.model.gpt import autocast_dtype
    from gptforge.model.mlp_epilogue import epilogue_mlp

    return epilogue_mlp(*(autocast_dtype(t) for t in (x, w1, b1, w2, b2)), bias_from_gemm=bias_from_gemm)


def after_layer_norm(mlp):
    """MLP after a LayerNorm with float32 gain and bias (the model's ln_2 before its MLP)."""
    def block(x, ln_w, ln_b, *params):
        return mlp(F.layer_norm(x, (x.shape[-1],), ln_w, ln_b), *params)
    return block


def inputs(tokens: int, width: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """The same weights (float32, GPT-2's N(0, 0.02)), input and output gradient for every implementation."""
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = ((4 * width, width), (4 * width,), (width, 4 * width), (width,))
    params = [(0.02 * torch.randn(s, device="cuda", generator=g)).requires_grad_() for s in shapes]
    x = torch.randn(tokens, width, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    grad = torch.randn(tokens, width, device="cuda", generator=g).to(torch.bfloat16)
    return params, x, grad


def measure(fn, tokens: int, width: int, args) -> tuple[dict, torch.Tensor, list[torch.Tensor]]:
    params, x, grad = inputs(tokens, width)
    if args.layer_norm:
        params = [torch.ones(width, device="cuda", requires_grad=True),
                  torch.zeros(width, device="cuda", requires_grad=True), *params]
        fn = after_layer_norm(fn)
    torch._dynamo.reset()  # each MLP and width compiled afresh (one code object serves every --layer-norm block)
    compiled = torch.compile(fn)

    def step():
        for t in (x, *params):
            t.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = compiled(x, *params)
        out.backward(grad)
        return out

    out = step()
    ms = cuda_ms(step, args.warmup, args.iters)
    flop = 2 * 3 * 2 * tokens * width * 4 * width
    total, kernels = kernel_ms(step)
    result = {"fwd_bwd_ms": ms, "tflops": flop / ms / 1e9, "host_ms": launch_ms(step, args.iters),
              "kernel_ms": total, "kernels": kernels}
    return result, out.detach(), [t.grad.detach() for t in (x, *params)]


MLPS = (("torch-compiled", torch_mlp), ("quack-epilogue", quack_mlp), ("gptforge", gptforge_mlp),
        ("gptforge-bias-gemm", functools.partial(gptforge_mlp, bias_from_gemm=True)))


def run(args) -> list[dict]:
    rows = []
    if args.gemms:
        rows.append({"mlp": "backward GEMMs alone", "gemms": backward_gemms(args)})
    for width in args.widths:
        reference = None
        for name, fn in ((n, f) for n, f in MLPS if n in args.mlps):
            row = {"mlp": name, "tokens": args.tokens, "width": width, "layer_norm": args.layer_norm}
            try:
                result, out, grads = measure(fn, args.tokens, width, args)
                row.update(result)
                if reference is None:
                    reference = (out, grads)
                else:
                    row["max_abs_out"] = (out - reference[0]).abs().max().item()
                    row["max_rel_grad"] = max(((g - r).abs().max() / r.abs().max()).item()
                                              for g, r in zip(grads, reference[1]))
            except Exception as e:  # a missing package or a kernel that fails is a row, not a crash
                row["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def backward_gemms(args) -> list[dict]:
    """The backward's GEMMs alone, each route's: quack's GELU-derivative GEMM with and without the bias
    gradient in its epilogue (its per-tile partials summed after it), the up-projection's weight-gradient GEMM
    with and without columns of ones beside its input (cuBLAS)."""
    from gptforge.model.bias_gemm import with_ones
    from gptforge.model.mlp_epilogue import dgelu, dgelu_dbias

    rows = []
    for width in args.widths:
        g = torch.Generator(device="cuda").manual_seed(0)
        tokens, hidden = args.tokens, 4 * width
        x, dout, preact = (torch.randn(tokens, n, device="cuda", generator=g).to(torch.bfloat16)
                           for n in (width, width, hidden))
        w2 = (0.02 * torch.randn(width, hidden, device="cuda", generator=g)).to(torch.bfloat16)
        wide = with_ones(x)
        dpreact = dgelu(dout, w2, preact)
        gemms = {"dgelu + bias gradient (epilogue)": lambda: dgelu_dbias(dout, w2, preact),
                 "dgelu": lambda: dgelu(dout, w2, preact),
                 "wgrad dpreact^T x": lambda: dpreact.t() @ x,
                 "wgrad dpreact^T [x | 1]": lambda: dpreact.t() @ wide}
        for name, fn in gemms.items():
            us = cuda_ms(fn, args.warmup, args.iters) * 1000
            rows.append({"gemm": name, "tokens": tokens, "width": width, "us": us,
                         "tflops": 2 * tokens * width * hidden / us / 1e6})
            print(json.dumps(rows[-1]), flush=True)  # as it comes: a run stopped later keeps it
    return rows


def print_kernels(rows: list[dict], top: int = 12) -> None:
    for r in rows:
        if "kernels" in r:
            print(f"\n{r['mlp']} {r['width']}: {r['kernel_ms'] * 1000:.0f} us of kernels")
            for k in r["kernels"][:top]:
                print(f"  {k['us_per_step']:8.1f} us {k['calls']:3d}x  {k['kernel']}")


def print_table(rows: list[dict]) -> None:
    print(f"\n{'mlp':18} {'width':>5} {'fwd+bwd ms':>11} {'host ms':>8} {'kernels ms':>10} {'TF/s':>6} {'max|Δout|':>10} "
          f"{'max rel Δgrad':>14}")
    for r in rows:
        if "gemms" in r:
            continue
        if "error" in r:
            print(f"{r['mlp']:18} {r['width']:>5} {r['error']}")
            continue
        print(f"{r['mlp']:18} {r['width']:>5} {r['fwd_bwd_ms']:11.3f} {r['host_ms']:8.3f} {r['kernel_ms']:10.3f} {r['tflops']:6.0f} "
              f"{r.get('max_abs_out', 0):10.2e} {r.get('max_rel_grad', 0):14.2e}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--widths", type=lambda s: [int(w) for w in s.split(",")], default=[768, 1024])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--layer-norm", action="store_true", help="a LayerNorm before each MLP, timed with it")
    parser.add_argument("--kernels", action="store_true", help="each MLP's longest kernels too")
    parser.add_argument("--gemms", action="store_true", help="the backward's GEMMs alone first, each bias-gradient route's")
    parser.add_argument("--mlps", type=lambda s: s.split(","), default=[name for name, _ in MLPS],
                        help="comma list of the variants to time (default all: " + ",".join(n for n, _ in MLPS) + ")")
    args = parser.parse_args()
    unknown = sorted(set(args.mlps) - {name for name, _ in MLPS})
    if unknown:
        print(f"mlp_epilogue.py: --mlps: unknown {', '.join(unknown)} (known: {', '.join(n for n, _ in MLPS)})",
              file=sys.stderr)
        return 2

    def show(rows: list[dict]) -> None:
        if args.kernels:
            print_kernels(rows)
        print_table(rows)
        for r in (gemm for row in rows for gemm in row.get("gemms", [])):
            print(f"{r['gemm']:34} {r['tokens']}x{r['width']}x{4 * r['width']}: {r['us']:7.1f} us {r['tflops']:5.0f} TFLOP/s")

    return run_gpu_bench("mlp_epilogue", args, run, show)


if __name__ == "__main__":
    sys.exit(main())
