"""How many threads a CPU run computes with.

torch starts one thread per core, and its OpenMP threads spin while they wait for one another: where other
processes keep some of the cores busy, every parallel operation waits for the thread that got no core, and a
step takes several times longer than on the idle cores alone. A CPU run therefore computes on the cores that
are idle when it starts (the cores it may use less the one-minute load average, at least one). OMP_NUM_THREADS
or MKL_NUM_THREADS, when set, is the user's choice and is left alone; it also pins the count for a bit-exact
--resume, since how torch splits a sum depends on it.
"""

from __future__ import annotations

import os

import torch

from gptforge.core.findings import Finding, Severity

USER_SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def idle_cores(cores: int, load: float) -> int:
    return max(1, min(cores, cores - round(load)))


def use_idle_cores(device: torch.device, env=os.environ) -> Finding | None:
    """Set torch's thread count for a run on DEVICE when it is the CPU; the note for the run's log says which."""
    if device.type != "cpu":
        return None
    if setting := next((name for name in USER_SETTINGS if env.get(name)), None):
        return Finding("cpu-threads", Severity.INFO, f"CPU threads: {torch.get_num_threads()} ({setting})")
    cores = len(os.sched_getaffinity(0))
    threads = idle_cores(cores, os.getloadavg()[0])
    torch.set_num_threads(threads)
    return Finding("cpu-threads", Severity.INFO,
                   f"CPU threads: {threads} of {cores} cores, the idle ones (OMP_NUM_THREADS=N sets the count)")
