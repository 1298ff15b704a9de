"""On a GPU with DeepSpeed: train/deepspeed_waits.py's ZeRO-2 optimizer step trains exactly as DeepSpeed's released
one does (the same losses and gradient norms, bit for bit, with the gradient clip scaling every step) and the host
no longer waits for the device inside it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs DeepSpeed")]

PROBE = Path(__file__).with_name("deepspeed_step_probe.py")


def test_zero2_step_trains_the_same_without_host_waits():
    src = str(PROBE.parent.parent / "src")
    proc = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
                               "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    released, stopped = result["released"], result["stopped"]
    assert stopped["applied"] and not released["applied"]
    assert stopped["losses"] == released["losses"] and stopped["norms"] == released["norms"], result
    assert min(released["norms"]) > 1e-3  # the clip scaled every step, so the changed clip did run
    assert released["waits"] >= len(released["losses"]) and stopped["waits"] == 0, result
