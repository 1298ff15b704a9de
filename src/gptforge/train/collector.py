"""Python's garbage collector while the training loop runs: automatic collection off, the young generations
collected every N steps.

A full (generation 2) collection walks every object the process holds. After torch.compile, and with
the CuTe DSL's kernels loaded, that is millions of objects, and the host stall can outlast the one step
the loop keeps queued on the GPU. Collecting the young generations at a fixed step, right after a step
is queued, keeps each collection short and under the GPU's work (torchtitan's gc_freq, Megatron-LM's
--manual-gc)."""

from __future__ import annotations

import gc


class ScheduledCollector:
    """``with collector:`` holds the automatic collector off (when INTERVAL > 0); ``after_step(n)`` collects
    generations 0 and 1 when N is a multiple of INTERVAL."""

    def __init__(self, interval: int):
        self.interval = interval
        self.holding = False

    def __enter__(self) -> ScheduledCollector:
        if self.interval > 0 and gc.isenabled():  # a caller that turned it off keeps it off
            gc.disable()
            self.holding = True
        return self

    def __exit__(self, *exc) -> None:
        if self.holding:
            gc.enable()
            self.holding = False

    def after_step(self, step: int) -> None:
        if self.holding and step % self.interval == 0:
            gc.collect(1)
