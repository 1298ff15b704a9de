"""DeepSpeed's ZeRO-1/2 optimizer step without the host reads that stall it.

Under bf16 with no overflow check (the packaged zero1/zero2 configs), DeepSpeed 0.19's step reads a device value
on the host three times per parameter group: its gradient-norm mask makes its fill value on the host and copies it
over, the masked fill reads that value back, and the clip asks whether the norm is finite. Each read waits for
every kernel queued before it, the backward included, so the host cannot queue the next step while the device runs
this one, and the device idles while the host catches up (bench/results/sharded.md). The same arithmetic, on the
device only:

- the masked norm is -1 where DeepSpeed's is (it fills -1 whatever value it is given);
- the combined norm DeepSpeed hands the clip is already +inf when any group's was not finite
  (``combine_grad_norm_groups``, the releases that ask), so the finiteness check changes nothing, and an
  infinite norm scales the gradients by 1/inf as DeepSpeed's does.
"""

from __future__ import annotations

import types

import torch


def mask_invalid_norm(norm: torch.Tensor, device=None, val: float = -1.0) -> None:
    """DeepSpeed's mask_nan_or_inf_with_val_inplace, filling from a Python number instead of a device tensor."""
    norm.masked_fill_(norm.isnan() | norm.isinf(), -1.0)


def unscale_and_clip_on_device(self, grad_groups_flat, total_norm) -> None:
    """DeepSpeedZeroOptimizer.unscale_and_clip_grads for a norm that is finite or +inf, with no host read."""
    if self.clip_grad == 0.0 and self.loss_scale == 1.0:
        return
    combined_scale = self.loss_scale
    if self.clip_grad > 0.0:
        clip = torch.clamp((total_norm / self.loss_scale + 1e-6) / self.clip_grad, min=1.0)
        combined_scale = clip * self.loss_scale
    for grad in grad_groups_flat:
        for part in grad if isinstance(grad, list) else [grad]:
            part.data.mul_(1.0 / combined_scale)


def stop_host_waits(optimizer) -> bool:
    """Make a ZeRO-1/2 bf16 optimizer's step free of host reads; False where it is not one this applies to (ZeRO-3,
    fp16, the overflow check on, offload, a DeepSpeed whose norm is not yet +inf when invalid)."""
    try:
        from deepspeed.runtime import utils
        from deepspeed.runtime.zero import stage_1_and_2
    except ImportError:
        return False
    applies = (isinstance(optimizer, stage_1_and_2.DeepSpeedZeroOptimizer) and hasattr(utils, "combine_grad_norm_groups")
               and hasattr(stage_1_and_2, "mask_nan_or_inf_with_val_inplace")
               and getattr(optimizer, "dtype", None) == torch.bfloat16
               and getattr(optimizer, "check_grad_overflow", True) is False
               and getattr(optimizer, "cpu_offload", True) is False)
    if not applies:
        return False
    stage_1_and_2.mask_nan_or_inf_with_val_inplace = mask_invalid_norm
    optimizer.unscale_and_clip_grads = types.MethodType(unscale_and_clip_on_device, optimizer)
    return True
