"""Causal attention at GPT-2's shapes, forward + backward: SDPA's cuDNN and FlashAttention 2 kernels, and cuDNN's
forward with FlashAttention 4's backward (accel=hopper's).

    PYTHONPATH=src python3 bench/attention_kernels.py                  # 124M (12 heads) and 350M (16 heads)
    PYTHONPATH=src python3 bench/attention_kernels.py --heads 12 --batch 16

Each kernel runs as the model calls it: from one (batch, seq, 3·width) qkv tensor to a (batch, seq, width)
output. Per kernel: SDPA's cuDNN attention and FlashAttention 2 (PyTorch's own flash kernel), with the
transposes in and the copy out that SDPA's layout needs, and cuDNN's forward with FlashAttention 4's
backward (`flash_attn.cute`, the flash-attn-4 package) through gptforge's custom ops (`accel/attention.py`),
which need neither and write the gradients of q, k and v into one qkv-shaped tensor. Times (CUDA events, after warm-up) forward
alone and forward + backward, the host time to issue a forward + backward (where it reaches the GPU
time, Python and launches bound the kernel), TFLOP/s counting the causal half (forward 2·2·B·H·T²·D / 2,
backward 2.5× that), and the largest difference of the output and of each gradient from cuDNN's. Each
kernel also runs once under torch.compile, as the trainer calls it. A table is printed; JSON goes to
$GPTFORGE_BENCH_OUT/attention_kernels.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_timing import cuda_ms, launch_ms, run_gpu_bench  # noqa: E402

from gptforge.core.installed import import_error  # noqa: E402
from gptforge.accel.attention import MODULE as FA4_MODULE, cudnn_flash4_attention  # noqa: E402


def sdpa(backend: SDPBackend):
    def attend(qkv, heads):  # as the model calls it: (batch, seq, 3·width) in, (batch, seq, width) out
        batch, seq, width3 = qkv.shape
        q, k, v = (t.view(batch, seq, heads, -1).transpose(1, 2) for t in qkv.split(width3 // 3, dim=2))
        with sdpa_kernel([backend]):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(batch, seq, width3 // 3)
    return attend


KERNELS = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "flash2": sdpa(SDPBackend.FLASH_ATTENTION),
           "cudnn-flash4": cudnn_flash4_attention}


def measure(attend, shape: tuple[int, int, int, int], grad_out, reference, args) -> dict:
    batch, seq, heads, head_dim = shape
    qkv = reference["qkv"].clone().requires_grad_()
    out = attend(qkv, heads)
    out.backward(grad_out)
    row = {"max_abs_out": (out - reference["out"]).abs().max().item() if "out" in reference else 0.0,
           "max_abs_grad": (qkv.grad - reference["grad"]).abs().max().item() if "grad" in reference else 0.0}
    reference.setdefault("out", out.detach())
    reference.setdefault("grad", qkv.grad.detach().clone())

    def forward():
        with torch.no_grad():
            attend(qkv, heads)

    def forward_backward():
        qkv.grad = None
        attend(qkv, heads).backward(grad_out)

    fwd_flop = 2 * 2 * batch * heads * seq * seq * head_dim / 2
    row["fwd_ms"] = cuda_ms(forward, args.warmup, args.iters)
    row["fwd_bwd_ms"] = cuda_ms(forward_backward, args.warmup, args.iters)
    row["host_ms"] = launch_ms(forward_backward, args.iters)
    row["fwd_tflops"] = fwd_flop / row["fwd_ms"] / 1e9
    row["bwd_tflops"] = 2.5 * fwd_flop / (row["fwd_bwd_ms"] - row["fwd_ms"]) / 1e9
    compiled = torch.compile(attend, fullgraph=True)
    qkv.grad = None
    compiled(qkv, heads).backward(grad_out)
    row["compiled_max_abs_grad"] = (qkv.grad - reference["grad"]).abs().max().item()
    return row


def run(args) -> list[dict]:
    rows = []
    shapes = [(args.batch, args.seq, heads, args.head_dim) for heads in args.heads]
    references = {shape: {"qkv": torch.randn(shape[0], shape[1], 3 * shape[2] * shape[3], device="cuda",
                                             dtype=torch.bfloat16)} for shape in shapes}
    grads = {shape: torch.randn(shape[0], shape[1], shape[2] * shape[3], device="cuda", dtype=torch.bfloat16)
             for shape in shapes}
    fa4_error = import_error(FA4_MODULE)
    for name, attend in KERNELS.items():
        for shape in shapes:
            row = {"kernel": name, "batch": shape[0], "seq": shape[1], "heads": shape[2], "head_dim": shape[3]}
            if name.endswith("flash4") and fa4_error:
                row["skipped"] = fa4_error
            else:
                try:
                    row.update(measure(attend, shape, grads[shape], references[shape], args))
                except Exception as e:  # a kernel that cannot take the call is a result, not a crash
                    row["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"\n{'kernel':12} {'heads':>5} {'fwd ms':>8} {'fwd+bwd ms':>11} {'host ms':>8} {'fwd TF/s':>9} {'bwd TF/s':>9} "
          f"{'max|Δout|':>10} {'max|Δgrad|':>11} {'compiled':>10}")
    for r in rows:
        if "fwd_ms" not in r:
            print(f"{r['kernel']:12} {r['heads']:>5} {r.get('skipped') or r.get('error')}")
            continue
        print(f"{r['kernel']:12} {r['heads']:>5} {r['fwd_ms']:8.3f} {r['fwd_bwd_ms']:11.3f} {r['host_ms']:8.3f} {r['fwd_tflops']:9.0f} "
              f"{r['bwd_tflops']:9.0f} {r['max_abs_out']:10.2e} {r['max_abs_grad']:11.2e} "
              f"{r['compiled_max_abs_grad']:10.2e}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--heads", type=lambda s: [int(h) for h in s.split(",")], default=[12, 16])
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    return run_gpu_bench("attention_kernels", parser.parse_args(), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
