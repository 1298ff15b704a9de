"""A training step queued on the device and read back later: its loss and gradient norm, the time it took on the
device's own clock, and the memory the run has used."""

from __future__ import annotations

import resource
from dataclasses import dataclass

import torch


@dataclass
class LaunchedStep:
    """A step queued on the device; its loss and gradient norm arrive in ``values`` once ``ready`` has passed."""
    step: int
    values: torch.Tensor  # (loss, grad norm), host memory
    ready: torch.cuda.Event | None  # None: already there
    lr: float
    t0: float
    start: torch.cuda.Event | None = None  # on the device's timeline where the step began (CUDA only)
    overlapped: bool = False  # queued while the step before it was still running
    done: float | None = None  # host clock when the step's work was over: a CPU's, which does it while queuing it


def copy_to_host(values: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """A copy to host memory queued behind the work that makes VALUES, and the event that marks it done.

    A plain .item() would wait for everything queued on the stream, the next step included."""
    if values.device.type != "cuda":
        return values, None
    host = values.to("cpu", non_blocking=True)
    return host, recorded_event()


def recorded_event() -> torch.cuda.Event:
    """A timing event recorded on the current stream: where the device has got to, on its own clock."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB -> GiB (peak RSS)



class StepClock:
    """The time a finished step took, each second counted for one step only.

    On CUDA from the device's own clock: from the end of the step before it when it was queued behind that
    one, else from its own start (the first step, compilation included, and the step after a pause to
    evaluate or save). Host clocks would charge a step for when the host happened to look. A CPU has no
    such clock and no queue: it has done a step's work by the time the step is queued."""

    def __init__(self):
        self.last_ready: torch.cuda.Event | None = None  # the device's end of the last step read

    def seconds(self, launched: LaunchedStep) -> float:
        if launched.ready is None or launched.start is None:
            return launched.done - launched.t0
        begin = self.last_ready if launched.overlapped and self.last_ready is not None else launched.start
        self.last_ready = launched.ready
        return begin.elapsed_time(launched.ready) / 1e3
