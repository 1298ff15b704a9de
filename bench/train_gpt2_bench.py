#!/usr/bin/env python
"""GPT-2 training throughput on one GPU through the real trainer: tokens/s, ms/step, MFU, peak memory.

Each variant (eager / torch.compile, micro-batch size) runs in its own
process: `gptforge.train.loop.train` on synthetic tokens with the GPT-2 vocabulary (50257 -> 50304), seq
1024, bf16, one optimizer step per micro batch. The first --warmup steps (compilation, allocator warm-up)
are dropped; figures are over the next --steps steps. MFU uses the PaLM formula and the peak from
configs/gpu_peaks.toml. Prints a table; writes train_gpt2_bench.json to $GPTFORGE_BENCH_OUT (or .).

    python bench/train_gpt2_bench.py                     # default variants
    python bench/train_gpt2_bench.py --variants eager-16,compile-16,compile-32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

GPT2_VOCAB = 50257


class RandomTokens:
    """Uniform random token rows: the data path's cost without a corpus (nanoGPT's bench.py does the same)."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int):
        import numpy as np

        self.rows = np.random.default_rng(seed).integers(0, vocab, size=(n, seq + 1), dtype=np.int64)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def run_variant(name: str, config: str, warmup: int, steps: int, out_dir: Path) -> dict:
    """One variant through gptforge.train.loop.train: MODE-MICRO, MODE in eager, compile."""
    import torch

    from gptforge.train.config import load_config
    from gptforge.train.data import DataSetup, TokenizerSpec
    from gptforge.train.loop import RunOptions, train
    from gptforge.train.metrics import read_records

    mode, micro = name.rsplit("-", 1)
    overrides = [f"micro-batch-size={micro}", f"global-batch-size={micro}", f"train-iters={warmup + steps}",
                 "eval-interval=1000000", "eval-iters=1", f"lr-warmup-iters={min(10, warmup)}", "save-interval=1000000", "log-interval=10",
                 "precision=bf16", f"compile={'true' if 'compile' in mode else 'false'}"]
    cfg, _ = load_config(config, overrides)
    n = (warmup + steps) * cfg.global_batch_size
    data = DataSetup(RandomTokens(n, cfg.seq_length, GPT2_VOCAB, 0), RandomTokens(cfg.global_batch_size, cfg.seq_length, GPT2_VOCAB, 1),
                     TokenizerSpec("gpt2"), GPT2_VOCAB, "synthetic GPT-2-vocabulary tokens")
    run_dir = out_dir / name
    result = train(cfg, RunOptions(run_dir=run_dir, config_name=f"{config} {name}"), data=data)
    timed = [r for r in read_records(run_dir / "metrics.jsonl", "train") if r["step"] > warmup]
    seconds = sum(r["step_ms"] for r in timed) / 1e3
    tokens = len(timed) * cfg.global_batch_size * cfg.seq_length
    tok_s = tokens / seconds
    from gptforge.model.gpt import GPT
    from gptforge.train.peaks import lookup, mfu

    flops = GPT(cfg.model_config(GPT2_VOCAB)).flops_per_token(cfg.seq_length)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    peak = lookup(gpu)
    return {"variant": name, "micro_batch": cfg.micro_batch_size, "compile": cfg.compile, "steps": len(timed),
            "tokens_per_s": tok_s, "ms_per_step": 1e3 * seconds / len(timed), "mfu": mfu(flops, tok_s, peak),
            "peak_mem_gib": max(r["mem_gib"] for r in timed), "final_loss": result.final_train_loss,
            "notes": [note.to_json() for note in result.notes], "gpu": gpu, "peak_tflops": (peak.bf16_flops or 0) / 1e12,
            "flops_per_token": flops, "torch": torch.__version__}


def run_ceiling(name: str, config: str, warmup: int, steps: int) -> dict:
    """The same model, bf16 autocast, fused AdamW, clipping and torch.compile, on one batch already on the
    GPU and with no host sync inside the timed steps: what the trainer's loop (data, per-step loss read,
    logging) costs is the difference to the trainer's figure."""
    import time

    import torch

    from gptforge.model.gpt import GPT
    from gptforge.train.config import load_config
    from gptforge.train.optim import param_groups
    from gptforge.train.peaks import lookup, mfu

    micro = int(name.rsplit("-", 1)[1])
    cfg, _ = load_config(config, [f"micro-batch-size={micro}", f"global-batch-size={micro}"])
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT(cfg.model_config(GPT2_VOCAB)).cuda()
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-4, betas=(0.9, 0.95), fused=True)
    step_fn = torch.compile(model)
    tokens = torch.randint(0, GPT2_VOCAB, (micro, cfg.seq_length + 1), device="cuda")

    def one_step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = step_fn(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        one_step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        one_step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    tok_s = steps * micro * cfg.seq_length / seconds
    gpu = torch.cuda.get_device_name()
    peak = lookup(gpu)
    flops = model.flops_per_token(cfg.seq_length)
    return {"variant": name, "micro_batch": micro, "compile": True, "steps": steps, "tokens_per_s": tok_s,
            "ms_per_step": 1e3 * seconds / steps, "mfu": mfu(flops, tok_s, peak),
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30, "gpu": gpu,
            "peak_tflops": (peak.bf16_flops or 0) / 1e12, "flops_per_token": flops, "torch": torch.__version__}


def default_variants() -> list[str]:
    return ["eager-16", "compile-16", "compile-32", "compile-64", "ceiling-32"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="gpt2-124m")
    p.add_argument("--variants", help="comma list of MODE-MICRO, MODE in eager, compile, "
                   "ceiling (no trainer loop: model + optimizer only)")
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--one", help=argparse.SUPPRESS)  # child process: run this variant, print JSON
    args = p.parse_args()
    out = Path(os.environ.get("GPTFORGE_BENCH_OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gptforge-bench-"))
    if args.one:
        run = run_ceiling if args.one.startswith("ceiling") else lambda *a: run_variant(*a, work)
        print("RESULT " + json.dumps(run(args.one, args.config, args.warmup, args.steps)))
        return 0
    rows = []
    for name in (args.variants.split(",") if args.variants else default_variants()):
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--config", args.config,
                               "--warmup", str(args.warmup), "--steps", str(args.steps)], capture_output=True, text=True)
        sys.stderr.write(proc.stderr[-3000:])
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"{name}: failed (exit {proc.returncode})\n{proc.stdout[-2000:]}")
            rows.append({"variant": name, "failed": proc.returncode})
            continue
        rows.append(json.loads(lines[-1][7:]))
    (out / "train_gpt2_bench.json").write_text(json.dumps(rows, indent=2))
    ok = [r for r in rows if "failed" not in r]
    if ok:
        print(f"\n{args.config}, seq 1024, bf16 autocast, fused AdamW, one optimizer step per micro batch, {ok[0]['gpu']} (peak {ok[0]['peak_tflops']:.1f} TFLOP/s dense bf16), "
              f"torch {ok[0]['torch']}, {args.steps} timed steps after {args.warmup} warm-up")
    print(f"{'variant':<18}{'micro':>6}{'tokens/s':>12}{'ms/step':>10}{'MFU':>8}{'peak GiB':>10}")
    for r in rows:
        if "failed" in r:
            print(f"{r['variant']:<18}  failed")
            continue
        util = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(f"{r['variant']:<18}{r['micro_batch']:>6}{r['tokens_per_s']:>12,.0f}{r['ms_per_step']:>10.1f}{util:>8}{r['peak_mem_gib']:>10.2f}")
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
