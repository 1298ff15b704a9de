#!/usr/bin/env bash
# Device benchmark of `gptforge build apex` and `gptforge build deepspeed-ops` (figures in docs/build.md).
#
#   bench/build_apex_device.sh [main|ratio|deepspeed|verify|all]...      (default: all = main, deepspeed, ratio)
#
# main       two `build apex` processes start on one empty cache (the second with --no-install, as a
#            second node would): wall time of the default build set for the GPUs present, number of
#            compiles, the numeric checks; then a reinstall from the cache and a --verify-only, timed.
# ratio      apex_C,amp_C,fused_layer_norm_cuda built for the targeted arch list and for apex's own
#            default list for this nvcc (read from apex's setup.py), same job budget, one after the other.
# deepspeed  DeepSpeed fused_adam prebuilt (DS_BUILD_FUSED_ADAM=1) from an sdist, installed, used (no JIT).
#
# Inputs (env): APEX_SRC (apex checkout, default third_party/apex); DS_SDIST (DeepSpeed sdist, default the
# first .whl/deepspeed-*.tar.gz); WHEELS (wheels of missing Python deps, default .whl; deepspeed wheels in it
# are skipped); PYTHON (default python3); DS_OPS (default fused_adam).
# Outputs: $GPTFORGE_BENCH_OUT (default bench-out/): one JSON per step, results.json, a table on stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${GPTFORGE_BENCH_OUT:-bench-out}
mkdir -p "$RESULTS"
PY=${PYTHON:-python3}
APEX_SRC=${APEX_SRC:-third_party/apex}
WHEELS=${WHEELS:-.whl}
DS_SDIST=${DS_SDIST:-$(ls "$WHEELS"/deepspeed-*.tar.gz 2>/dev/null | head -1)}
DS_OPS=${DS_OPS:-fused_adam}
PHASES=${*:-all}
WORK=$(mktemp -d)
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export PYTHONPATH="$PWD/src:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
GF=("$PY" -m gptforge)
# Builds use CUDA_HOME; when unset, the toolkit root the nvcc found resolves to (what the preflight's fix says).
if [ -z "${CUDA_HOME:-}" ]; then
  CUDA_HOME=$("$PY" -c 'from gptforge.build.toolchain import complete_toolkit_root as r
from gptforge.probe.nvcc import probe_nvcc; print(r(probe_nvcc()) or "")')
  [ -n "$CUDA_HOME" ] && export CUDA_HOME
fi

DEADLINE=$(( $(date +%s) + ${BENCH_BUDGET_S:-570} ))  # stop starting work that cannot finish in time
left() { echo $(( DEADLINE - $(date +%s) - 15 )); }
now() { date +%s.%N; }
since() { "$PY" -c "import sys; print(round($(now) - $1, 1))"; }
want() { [[ ( " $PHASES " == *" all "* && $1 != verify ) || " $PHASES " == *" $1 "* ]]; }
record() { echo "$1=$2" >> "$RESULTS/figures.env"; echo "  $1 = $2"; }
: > "$RESULTS/figures.env"

# Python dependencies the machine lacks (DeepSpeed's), never DeepSpeed itself: it is built below.
deps=$(ls "$WHEELS"/*.whl 2>/dev/null | grep -v '/deepspeed-' || true)
if [ -n "$deps" ]; then
  "$PY" -m pip install -q --no-index --no-deps --target "$WORK/site" $deps || echo "warning: dependency wheels did not install"
fi

record cores "$(nproc)"
record mem_total_gib "$(awk '/MemTotal/ {printf "%.0f", $2/1048576}' /proc/meminfo)"
record gpu "\"$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)\""
record pip "$("$PY" -m pip --version | awk '{print $2}')"
record torch "$("$PY" -c 'import torch; print(torch.__version__)')"

# Lowest MemAvailable while builds run: peak memory the compilers used.
( low=999999999; while :; do a=$(awk '/MemAvailable/ {print $2}' /proc/meminfo); [ "$a" -lt "$low" ] && low=$a && echo "$low" > "$WORK/mem_low"; sleep 0.5; done ) &
MEMPID=$!
MEM_START=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)

if want main; then
  echo "== main: two concurrent builds of the default set on one empty cache"
  C1="$WORK/shared-cache"
  t0=$(now)
  timeout "$(left)" "${GF[@]}" build apex --src "$APEX_SRC" --cache "$C1" --json > "$RESULTS/apex_A.json" 2> "$RESULTS/apex_A.err" &
  PA=$!
  for _ in $(seq 600); do ls "$C1"/apex/*.lock > /dev/null 2>&1 && break; kill -0 $PA 2> /dev/null || break; sleep 0.2; done
  tB=$(now)
  timeout "$(left)" "${GF[@]}" build apex --src "$APEX_SRC" --cache "$C1" --no-install --json > "$RESULTS/apex_B.json" 2> "$RESULTS/apex_B.err" &
  PB=$!
  wait $PA; record apex_A_exit $?; record apex_A_wall_s "$(since "$t0")"
  wait $PB; record apex_B_exit $?; record apex_B_wall_s "$(since "$tB")"
  record apex_compiles "$(ls "$C1"/apex/logs/*.log 2> /dev/null | wc -l)"
  cp "$C1"/apex/logs/*.log "$RESULTS/apex_build.log" 2> /dev/null
  t=$(now)
  "${GF[@]}" build apex --src "$APEX_SRC" --cache "$C1" --no-verify --json > "$RESULTS/apex_reinstall.json" 2> "$RESULTS/apex_reinstall.err"
  record apex_reinstall_exit $?; record apex_reinstall_wall_s "$(since "$t")"
  t=$(now)
  "${GF[@]}" build apex --verify-only --json > "$RESULTS/apex_verify.json" 2> "$RESULTS/apex_verify.err"
  record apex_verify_exit $?; record apex_verify_wall_s "$(since "$t")"
  [ -f "$WORK/mem_low" ] && record peak_mem_used_gib "$(awk -v s="$MEM_START" '{printf "%.1f", (s-$1)/1048576}' "$WORK/mem_low")"
fi

if want verify; then  # apex already installed (an earlier run on this machine): only the checks, timed
  t=$(now)
  "${GF[@]}" build apex --verify-only --json > "$RESULTS/apex_verify.json" 2> "$RESULTS/apex_verify.err"
  record apex_verify_exit $?; record apex_verify_wall_s "$(since "$t")"
fi

if want deepspeed && [ "$(left)" -gt 60 ]; then
  echo "== deepspeed: $DS_OPS prebuilt from $DS_SDIST"
  t=$(now)
  timeout "$(left)" "${GF[@]}" build deepspeed-ops --ops "$DS_OPS" --src "$DS_SDIST" --cache "$WORK/ds-cache" --json \
    > "$RESULTS/ds.json" 2> "$RESULTS/ds.err"
  record ds_exit $?; record ds_wall_s "$(since "$t")"
  cp "$WORK"/ds-cache/deepspeed/logs/*.log "$RESULTS/ds_build.log" 2> /dev/null
fi

if want ratio; then
  SUBSET=apex_C,amp_C,fused_layer_norm_cuda
  TARGET=$("$PY" -c 'from gptforge.build.toolchain import probe_toolchain as p; from gptforge import compat
t = p(); print(compat.arch_list_for([tuple(map(int, c.split("."))) for c in t.ccs], t.nvcc_version))')
  NVCC=$("$PY" -c 'from gptforge.build.toolchain import probe_toolchain as p; print(p().nvcc_version)')
  # apex's own default list for this nvcc: the first `>= Version("X.Y")` branch of its setup.py that applies.
  DEFAULT=$("$PY" - "$APEX_SRC/setup.py" "$NVCC" <<'EOF'
import re, sys
from packaging.version import Version
text, nvcc = open(sys.argv[1]).read(), Version(sys.argv[2])
for ver, archs in re.findall(r'bare_metal_version >= Version\("([\d.]+)"\):\s*\n\s*os.environ\["TORCH_CUDA_ARCH_LIST"\] = "([^"]+)"', text):
    if nvcc >= Version(ver):
        print(archs)
        break
EOF
)
  echo "== ratio: $SUBSET for '$TARGET' vs apex's default '$DEFAULT'"
  record ratio_target_arch "\"$TARGET\""; record ratio_default_arch "\"$DEFAULT\""
  for which in target default; do
    arch=$([ $which = target ] && echo "$TARGET" || echo "$DEFAULT")
    [ "$(left)" -gt 30 ] || { echo "no time left for $which"; continue; }
    t=$(now)
    timeout "$(left)" "${GF[@]}" build apex --src "$APEX_SRC" --cache "$WORK/ratio-$which" --extensions "$SUBSET" \
      --arch "$arch" --no-install --json > "$RESULTS/ratio_$which.json" 2> "$RESULTS/ratio_$which.err"
    record "ratio_${which}_exit" $?; record "ratio_${which}_wall_s" "$(since "$t")"
  done
fi

kill $MEMPID 2> /dev/null
"$PY" bench/build_report.py "$RESULTS"
rm -rf "$WORK"
