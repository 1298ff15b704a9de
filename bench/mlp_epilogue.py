"""GPT-2's MLP (Linear, GELU tanh, Linear) forward + backward: compiled torch against GEMMs with GELU in the epilogue.

    PYTHONPATH=src python3 bench/mlp_epilogue.py                 # 124M (768) and 350M (1024) widths, 32768 tokens

The model's MLP as the trainer runs it — float32 weights and biases, bf16 autocast, torch.compile — against
quack's `mlp_func` (the quack-kernels package): the up-projection's GEMM applies bias and GELU in its
epilogue and stores the pre-activation; in the backward the down-projection's input-gradient GEMM
applies GELU's derivative in its epilogue, so no separate GELU kernels run. Times (CUDA events, after
warm-up and quack's autotuning) forward + backward, the host time to issue one (where it reaches the
GPU time, the MLP is bound by Python and launches, which the trainer's queued step hides), and the largest difference of the output and
each gradient from torch's. A third row is gptforge's MLP (model/mlp_epilogue.py, what gelu-epilogue=true
runs): quack's forward GEMMs, the up-projection's bias gradient summed in the epilogue of the GEMM that
applies GELU's derivative, the other GEMMs of the backward from cuBLAS. A table is printed; JSON goes to
$GPTFORGE_BENCH_OUT/mlp_epilogue.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fp8_linear import cuda_ms, launch_ms, run_gpu_bench  # noqa: E402


def torch_mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)


def quack_mlp(x, w1, b1, w2, b2):
    from quack.mlp import mlp_func

    from gptforge.model.gpt import autocast_dtype

    return mlp_func(x, w1, w2, "gelu_tanh_approx", bias1=autocast_dtype(b1), bias2=autocast_dtype(b2))


def gptforge_mlp(x, w1, b1, w2, b2):
    from gptforge.model.gpt import autocast_dtype
    from gptforge.model.mlp_epilogue import epilogue_mlp

    return epilogue_mlp(*(autocast_dtype(t) for t in (x, w1, b1, w2, b2)))


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
    result = {"fwd_bwd_ms": ms, "tflops": flop / ms / 1e9, "host_ms": launch_ms(step, args.iters)}
    return result, out.detach(), [t.grad.detach() for t in (x, *params)]


def run(args) -> list[dict]:
    rows = []
    for width in args.widths:
        reference = None
        for name, fn in (("torch-compiled", torch_mlp), ("quack-epilogue", quack_mlp), ("gptforge", gptforge_mlp)):
            row = {"mlp": name, "tokens": args.tokens, "width": width}
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


def print_table(rows: list[dict]) -> None:
    print(f"\n{'mlp':16} {'width':>5} {'fwd+bwd ms':>11} {'host ms':>8} {'TF/s':>6} {'max|Δout|':>10} {'max rel Δgrad':>14}")
    for r in rows:
        if "error" in r:
            print(f"{r['mlp']:16} {r['width']:>5} {r['error']}")
            continue
        print(f"{r['mlp']:16} {r['width']:>5} {r['fwd_bwd_ms']:11.3f} {r['host_ms']:8.3f} {r['tflops']:6.0f} "
              f"{r.get('max_abs_out', 0):10.2e} {r.get('max_rel_grad', 0):14.2e}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--widths", type=lambda s: [int(w) for w in s.split(",")], default=[768, 1024])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    return run_gpu_bench("mlp_epilogue", parser.parse_args(), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
