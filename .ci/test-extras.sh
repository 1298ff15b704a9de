#!/usr/bin/env bash
# What the interoperability tests read, installed into .ci/ and kept out of the environment so that
# nothing of gptforge can import them by accident: Megatron-LM's released dataset code (megatron-core
# on PyPI; tests/test_data_megatron.py finds it through MEGATRON_LM_SRC) and Triton, for the loss
# kernel's test in Triton's interpreter on the CPU (tests/test_xent_kernel.py reads .ci/triton).
# Usage: .ci/test-extras.sh PIP...   e.g. `.venv/bin/pip` (.ci/run) or `pixi run -e cpu uv pip` (the workflow)
set -euo pipefail
cd "$(dirname "$0")/.."
"$@" install --quiet --no-deps --target .ci/megatron-core megatron-core==0.16.1
"$@" install --quiet --no-deps --target .ci/triton triton==3.9.0
