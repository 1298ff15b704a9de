"""Where DeepSpeed is installed (the GPU environments): train/deepspeed_waits.py's ZeRO-2 optimizer step computes
what DeepSpeed's released one does, for finite, infinite and NaN gradient norms alike, trains to the same losses
and gradient norms bit for bit on a GPU, and the host no longer waits for the device inside it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
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


@pytest.mark.parametrize("groups", [[3.0, 4.0], [0.1, 0.2], [float("nan"), 1.0], [float("inf"), 2.0], [-0.0, 0.0],
                                    [1e30, 1e30]])
@pytest.mark.parametrize("clip_grad", [1.0, 0.0])
def test_the_norm_mask_and_clip_compute_what_deepspeeds_do(groups, clip_grad):
    from deepspeed.runtime import utils
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    from gptforge.train.deepspeed_waits import mask_invalid_norm, unscale_and_clip_on_device

    theirs, ours = [torch.tensor(g) for g in groups], [torch.tensor(g) for g in groups]
    for a, b in zip(theirs, ours):
        utils.mask_nan_or_inf_with_val_inplace(a, device="cpu")
        mask_invalid_norm(b, device="cpu")
        assert torch.equal(a, b)
    norm = utils.combine_grad_norm_groups(theirs)  # +inf when a group's norm was not finite
    optimizer = types.SimpleNamespace(clip_grad=clip_grad, loss_scale=1.0, device="cpu")
    expected = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    got = expected.clone()
    DeepSpeedZeroOptimizer.unscale_and_clip_grads(optimizer, [expected], norm)
    unscale_and_clip_on_device(optimizer, [got], norm)
    assert torch.equal(expected, got) or (expected.isnan().all() and got.isnan().all())
