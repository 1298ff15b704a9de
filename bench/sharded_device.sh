#!/usr/bin/env bash
# Sharded training on one multi-GPU host, run from the repository root:
#   bench/sharded_device.sh engines [MODELS] [ENGINES]  # 2 GPUs, same global batch: DDP, ZeRO-2, ZeRO-3, FSDP2
#   bench/sharded_device.sh tests                       # the multi-GPU tests (kill and resume; two nodes on 4 GPUs)
#   bench/sharded_device.sh scaling [FEW MANY [ENGINES]] # weak scaling (default 1 vs 4 GPUs), DDP and FSDP2 at 124M
#   bench/sharded_device.sh all                         # 4 GPUs: engines on GPUs 0-1 beside the tests on 2-3,
#                                                       # then weak scaling 1 vs 4 if DEADLINE (seconds) allows
#   bench/sharded_device.sh two                         # 2 GPUs: engines at 124M, the tests, then 350M if DEADLINE allows
#   bench/sharded_device.sh probe [VARIANTS]            # 2 GPUs, 124M: DDP and the candidate variants side by side,
#                                                       # in order until BUDGET (seconds, default 440) runs out; the
#                                                       # profiler's tables for the variants in PROFILE
# MODELS default "124m 350m", ENGINES "ddp fsdp zero2 zero3" (bench/sharded.py's VARIANTS names the others).
# DeepSpeed must be importable; on a machine without network install carried wheels first by pointing
# DS_WHEELS at their folder (DeepSpeed built with DS_BUILD_OPS=0, hjson, pydantic and its family; for the
# tests also jsonschema, jsonschema-specifications, referencing and rpds-py, which tests/conftest.py needs).
# Tables and logs go to $GPTFORGE_BENCH_OUT (default bench-out/sharded).
set -euo pipefail

MODE=${1:?probe, engines, tests, scaling, all or two}
RESULTS=${GPTFORGE_BENCH_OUT:-bench-out/sharded}
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}  # DeepSpeed's op builder rejects an "a" suffix
PY=${PYTHON:-python3}
if [ -n "${DS_WHEELS:-}" ] && ! $PY -c "import deepspeed, jsonschema" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps "$DS_WHEELS"/*.whl
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
$PY -c "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'gpus', torch.cuda.device_count())"
CACHE=${GPTFORGE_BENCH_DATA:-/tmp/gptforge-data}
$PY -c "from gptforge.train.config import load_config; from gptforge.train.data import prepare_default_corpus
print(prepare_default_corpus(load_config('gpt2-124m', ['data-cache-dir=$CACHE'])[0]).prefix)"

PYTEST=($PY -m pytest -p no:cacheprovider)
if $PY -c "import xdist" 2>/dev/null; then PYTEST+=(-n 0); fi

case "$MODE" in
probe)
    nvidia-smi topo -m || true
    echo "CUDA toolkit for DeepSpeed's op builds: $(command -v nvcc || echo none)"
    read -r -a VARIANTS <<< "${2:-ddp fsdp zero2 zero2-deepcompile fsdp-block zero3 zero3-deepcompile}"
    read -r -a PROFILED <<< "${PROFILE:-fsdp-block zero2}"
    read -r -a MORE <<< "${SHARDED_ARGS:-}"  # more bench/sharded.py arguments (a CPU dry run: --device cpu --models tiny ...)
    TORCH_LOGS=${TORCH_LOGS:-recompiles} $PY bench/sharded.py --gpus 2 --models 124m --engines "${VARIANTS[@]}" \
        --profile "${PROFILED[@]}" --warmup 15 --steps 30 --profile-steps 3 --run-timeout 150 \
        --deadline $((${BUDGET:-440} - SECONDS)) --min-run-s 45 --out "$RESULTS" --data-cache-dir "$CACHE" "${MORE[@]}" || true ;;
engines)
    read -r -a MODELS <<< "${2:-124m 350m}"
    read -r -a ENGINES <<< "${3:-ddp fsdp zero2 zero3}"
    $PY bench/sharded.py --gpus 2 --models "${MODELS[@]}" --engines "${ENGINES[@]}" --out "$RESULTS" --data-cache-dir "$CACHE" ;;
tests)
    "${PYTEST[@]}" -m gpu -v -rs tests/test_sharded_gpu.py 2>&1 | tee "$RESULTS/gpu_tests.log" ;;
all)
    (CUDA_VISIBLE_DEVICES=2,3 "${PYTEST[@]}" -m gpu -v -rs tests/test_sharded_gpu.py \
        > "$RESULTS/gpu_tests.log" 2>&1; echo "pytest exit status $?" >> "$RESULTS/gpu_tests.log") &
    TESTS=$!
    CUDA_VISIBLE_DEVICES=0,1 $PY bench/sharded.py --gpus 2 --models 124m 350m --engines ddp fsdp zero2 zero3 \
        --out "$RESULTS" --data-cache-dir "$CACHE" --steps "${STEPS:-30}" --run-timeout "${RUN_TIMEOUT:-150}" || true
    wait "$TESTS" || true
    tail -n 15 "$RESULTS/gpu_tests.log"
    if [ $((${DEADLINE:-0} - SECONDS)) -gt 240 ]; then
        $PY bench/sharded.py --weak-scaling 1 4 --models 124m --engines ddp fsdp --out "$RESULTS" \
            --data-cache-dir "$CACHE" --steps "${STEPS:-30}" --run-timeout 100 || true
    else
        echo "weak scaling not run: $((${DEADLINE:-0} - SECONDS)) s left before the deadline"
    fi ;;
two)
    $PY bench/sharded.py --gpus 2 --models 124m --engines ddp fsdp zero2 zero3 --out "$RESULTS" \
        --data-cache-dir "$CACHE" --steps "${STEPS:-30}" --run-timeout "${RUN_TIMEOUT:-120}" || true
    cp "$RESULTS/sharded.md" "$RESULTS/sharded-124m.md" 2>/dev/null || true
    "${PYTEST[@]}" -m gpu -v -rs tests/test_sharded_gpu.py 2>&1 | tee "$RESULTS/gpu_tests.log" || true
    if [ $((${DEADLINE:-0} - SECONDS)) -gt 200 ]; then
        $PY bench/sharded.py --gpus 2 --models 350m --engines ddp fsdp zero2 zero3 --out "$RESULTS" \
            --data-cache-dir "$CACHE" --steps 25 --run-timeout 90 || true
    else
        echo "350M not run: $((${DEADLINE:-0} - SECONDS)) s left before the deadline"
    fi ;;
scaling)
    read -r -a ENGINES <<< "${4:-ddp fsdp}"
    $PY bench/sharded.py --weak-scaling "${2:-1}" "${3:-4}" --models 124m --engines "${ENGINES[@]}" --out "$RESULTS" \
        --data-cache-dir "$CACHE" ;;
*)
    echo "unknown mode $MODE: probe, engines, tests, scaling, all or two" >&2; exit 2 ;;
esac
