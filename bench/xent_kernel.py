#!/usr/bin/env python
"""Cross-entropy over GPT-2 logits: the gptforge::xent Triton kernel against torch.compile's reference.

One batch of bf16 logits (--rows x 50304, GPT-2's padded vocabulary, 50257 real columns): the time to
go from logits to the loss and the logits' gradient, for
  reference  F.cross_entropy(logits[:, :50257].float(), targets) forward + backward, torch.compile'd
             (what GPT.forward does without the fused loss)
  triton     the kernel (accel/xent_kernel.py) at each --configs BLOCK/NUM_WARPS, writing a bf16 gradient
with the max |difference| of loss and gradient against the reference, and the bandwidth the time
means for one read of the logits and one write of the gradient (the kernel reads each row twice: past
that figure the second read comes from L2). CUDA events, median of --repeat runs after warm-up.

    PYTHONPATH=src python3 bench/xent_kernel.py --rows 32768 --configs 4096/8,8192/16,2048/4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

VOCAB, WIDTH = 50257, 50304


def median_ms(fn, warmup: int, repeat: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def reference(logits: torch.Tensor, targets: torch.Tensor):
    leaf = logits.detach().requires_grad_()
    loss = F.cross_entropy(leaf[:, :VOCAB].float(), targets)
    loss.backward()
    return loss.detach(), leaf.grad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=32768, help="tokens (batch x seq); default 32 x 1024")
    p.add_argument("--configs", default="4096/8,8192/16,2048/4,4096/16", help="BLOCK/NUM_WARPS pairs for the kernel")
    p.add_argument("--repeat", type=int, default=20)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("xent_kernel.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    from gptforge.accel import xent_kernel as X

    torch.manual_seed(0)
    logits = (torch.randn(a.rows, WIDTH, device="cuda") * 2).to(torch.bfloat16)
    targets = torch.randint(0, VOCAB, (a.rows,), device="cuda")
    ref = torch.compile(reference)
    loss_r, grad_r = ref(logits, targets)
    rows = [{"impl": "reference (compiled)", "ms": median_ms(lambda: ref(logits, targets), 3, a.repeat)}]
    scale, grad_width = 1.0 / a.rows, logits.element_size()  # bytes per gradient element: CONFIGS' key
    for cfg in a.configs.split(","):
        X.CONFIGS[grad_width] = tuple(int(v) for v in cfg.split("/"))
        loss_rows, grad = X.xent_triton(logits, targets, VOCAB, scale)
        ms = median_ms(lambda: X.xent_triton(logits, targets, VOCAB, scale), 3, a.repeat)
        rows.append({"impl": f"triton {cfg}", "ms": ms, "loss_diff": abs(loss_rows.mean().item() - loss_r.item()),
                     "grad_max_diff": (grad.float() - grad_r.float()).abs().max().item(),
                     "grad_scale": grad_r.float().abs().max().item()})
    moved = logits.numel() * (logits.element_size() + grad_width)  # one read of the logits, one write of the gradient
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {a.rows} x {WIDTH} bf16 logits and gradient")
    print(f"{'implementation':<24} {'ms':>8} {'GB/s (1R+1W)':>13} {'|Δ loss|':>10} {'max |Δ grad|':>13}")
    for r in rows:
        diffs = f"{r['loss_diff']:>10.2e} {r['grad_max_diff']:>13.2e}" if "loss_diff" in r else f"{'-':>10} {'-':>13}"
        print(f"{r['impl']:<24} {r['ms']:>8.3f} {moved / r['ms'] / 1e6:>13.0f} {diffs}")
    out = Path(os.environ.get("GPTFORGE_BENCH_OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "xent_kernel_bf16.json").write_text(json.dumps({"rows": a.rows, "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
