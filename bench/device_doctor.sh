#!/usr/bin/env bash
# gptforge doctor on a GPU machine: the text report, the JSON report (validated against the schema the
# package ships), and the probe/doctor tests including the GPU ones. Ends with a summary table.
#
#   GPTFORGE_BENCH_OUT=dir  where doctor.txt / doctor.json / pytest.txt go (default: bench-out)
#   GPTFORGE_WHEELS=dir     optional wheels to install first, for machines without network (e.g. jsonschema)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
out=${GPTFORGE_BENCH_OUT:-bench-out}
mkdir -p "$out"

if [ -n "${GPTFORGE_WHEELS:-}" ] && ls "$GPTFORGE_WHEELS"/*.whl >/dev/null 2>&1; then
    site=$(mktemp -d)
    $PY -m pip install -q --no-index --no-deps --target "$site" "$GPTFORGE_WHEELS"/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! command -v gptforge >/dev/null 2>&1; then
    $PY -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.txt" 2>&1 \
        || echo "editable install failed (see install.txt); using PYTHONPATH=src"
fi
if command -v gptforge >/dev/null 2>&1; then GPTFORGE=(gptforge); else
    export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"; GPTFORGE=($PY -m gptforge); fi

echo "== nvidia-smi"; nvidia-smi --query-gpu=driver_version,name,compute_cap,memory.total --format=csv || true
echo "== gptforge doctor"
COLUMNS=150 "${GPTFORGE[@]}" doctor | tee "$out/doctor.txt"; text_rc=${PIPESTATUS[0]}
"${GPTFORGE[@]}" doctor --json >"$out/doctor.json"; json_rc=$?
"${GPTFORGE[@]}" doctor --json --strict >/dev/null; strict_rc=$?

schema=$($PY - "$out/doctor.json" <<'PY'
import json, sys
from importlib import resources
try:
    from jsonschema import Draft202012Validator
except ImportError:
    print("skipped (jsonschema not installed)"); sys.exit()
schema = json.loads(resources.files("gptforge").joinpath("schemas/doctor.schema.json").read_text())
errors = list(Draft202012Validator(schema).iter_errors(json.load(open(sys.argv[1]))))
print("valid" if not errors else f"INVALID: {errors[0].message}")
PY
)

echo "== tests"
$PY -m pytest -q -p no:cacheprovider tests/test_probe.py tests/test_doctor.py >"$out/pytest.txt" 2>&1; tests_rc=$?
$PY -m pytest -q -p no:cacheprovider -m gpu tests/test_doctor_gpu.py >>"$out/pytest.txt" 2>&1; gpu_rc=$?
tail -25 "$out/pytest.txt"

echo "== summary"
printf '%-34s %s\n' "doctor exit status" "$text_rc" "doctor --json exit status" "$json_rc" \
    "doctor --json --strict exit status" "$strict_rc" "JSON against the schema" "$schema" \
    "probe/doctor tests exit status" "$tests_rc" "GPU tests exit status" "$gpu_rc"
