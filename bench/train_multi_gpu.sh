#!/usr/bin/env bash
# Multi-GPU checks on one host with >= 2 GPUs (run from the repository root):
#   1. weak scaling: GPT-2 124M, seq 1024, bf16, torch.compile, micro 16 x accumulation 4 per GPU,
#      torchrun DDP on 1 GPU and on 2 GPUs -> tokens/s, MFU, scaling efficiency = tok/s(2) / (2 x tok/s(1));
#   2. DeepSpeed ZeRO-2 (bf16, from configs/deepspeed/zero2.json) on the same model and 2 GPUs, started
#      by the deepspeed launcher -> the loss falls.
# Data: the embedded default corpus (prepared once, cached under .gptforge/data). Figures go to stdout
# and to $GPTFORGE_BENCH_OUT (default: bench-out/) as multi_gpu.json.
#
# DeepSpeed must be importable. On a machine without network, install the carried wheels first, e.g.
#   python3 -m pip install -q --no-index --no-deps --target "$PWD/.ds-site" .whl/*.whl && export PYTHONPATH="$PWD/.ds-site" PATH="$PWD/.ds-site/bin:$PATH"
# and build its ops for a plain arch: TORCH_CUDA_ARCH_LIST=9.0 (an "a" suffix breaks DeepSpeed's op builder).
set -euo pipefail

OUT=${GPTFORGE_BENCH_OUT:-bench-out}
STEPS=${STEPS:-80}          # optimizer steps per scaling run (the first WARMUP are not timed)
WARMUP=${WARMUP:-20}
DS_STEPS=${DS_STEPS:-200}
WORK=$(mktemp -d -t gptforge-multi-XXXX)
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_CUDA_ARCH_LIST=9.0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
PY=${PYTHON:-python3}
NGPU=$($PY -c "import torch; print(torch.cuda.device_count())")
if [ "$NGPU" -lt 2 ]; then echo "needs 2 GPUs, found $NGPU" >&2; exit 1; fi

COMMON=(--config gpt2-124m "train-iters=$STEPS" "lr-warmup-iters=10" micro-batch-size=16
        eval-interval=1000000 eval-iters=1 save-interval=1000000 log-interval=10 compile=true)

echo "== prepare the default corpus"
$PY -c "from gptforge.train.config import load_config; from gptforge.train.data import prepare_default_corpus
print(prepare_default_corpus(load_config('gpt2-124m')[0]).prefix)"

for n in 1 2; do
    echo "== torchrun DDP on $n GPU(s)"
    torchrun --standalone --nproc-per-node "$n" -m gptforge train "${COMMON[@]}" \
        "global-batch-size=$((64 * n))" --run-dir "$WORK/ddp$n" 2>&1 | tail -n 4
done

echo "== DeepSpeed ZeRO-2 on 2 GPUs"
deepspeed --num_gpus 2 --no_local_rank --module gptforge train --config gpt2-124m --deepspeed zero2 \
    "train-iters=$DS_STEPS" lr-warmup-iters=20 micro-batch-size=16 global-batch-size=64 \
    eval-interval=50 eval-iters=4 save-interval=100 log-interval=20 --run-dir "$WORK/zero2" 2>&1 | grep -E "step|DeepSpeed|done" | tail -n 20

WORK="$WORK" WARMUP="$WARMUP" OUT="$OUT" $PY - <<'PY'
import json, os
from pathlib import Path
work, warmup = Path(os.environ["WORK"]), int(os.environ["WARMUP"])
def timed(run):
    recs = [json.loads(l) for l in (work / run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train" and r["step"] > warmup]
    tok_s = sum(r["tokens_per_s"] * r["step_ms"] for r in train) / sum(r["step_ms"] for r in train)
    mfu = [r["mfu"] for r in train if r["mfu"] is not None]
    return {"tokens_per_s": tok_s, "ms_per_step": sum(r["step_ms"] for r in train) / len(train),
            "mfu": sum(mfu) / len(mfu) if mfu else None, "peak_mem_gib": max(r["mem_gib"] for r in train)}
one, two = timed("ddp1"), timed("ddp2")
eff = two["tokens_per_s"] / (2 * one["tokens_per_s"])
ds = [json.loads(l) for l in (work / "zero2" / "metrics.jsonl").read_text().splitlines()]
ds_eval = [r for r in ds if r["kind"] == "eval"]
ds_train = [r for r in ds if r["kind"] == "train"]
first, last = sum(r["loss"] for r in ds_train[:10]) / 10, sum(r["loss"] for r in ds_train[-10:]) / 10
result = {"ddp1": one, "ddp2": two, "scaling_efficiency": eff, "zero2_eval": ds_eval,
          "zero2_train_loss_first10": first, "zero2_train_loss_last10": last}
Path(os.environ["OUT"], "multi_gpu.json").write_text(json.dumps(result, indent=2))
print(f"\n{'run':<22}{'tokens/s':>12}{'ms/step':>10}{'MFU':>8}{'peak GiB':>10}")
for name, r in (("DDP 1 GPU", one), ("DDP 2 GPUs", two)):
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
    print(f"{name:<22}{r['tokens_per_s']:>12,.0f}{r['ms_per_step']:>10.1f}{mfu:>8}{r['peak_mem_gib']:>10.2f}")
print(f"scaling efficiency 2 GPUs vs 1: {100 * eff:.1f}%")
print("DeepSpeed ZeRO-2 validation loss: " + " -> ".join(f"{r['loss']:.3f}@{r['step']}" for r in ds_eval))
print(f"DeepSpeed ZeRO-2 train loss, mean of first 10 steps {first:.3f} -> last 10 steps {last:.3f}: "
      + ("falls" if last < first - 0.5 else "DOES NOT FALL"))
PY
