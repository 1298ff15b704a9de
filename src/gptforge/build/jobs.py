"""How many compiler processes a native build may run at once, from cores and free memory.

apex's setup.py builds extensions one after another unless ``APEX_PARALLEL_BUILD=P`` runs P of them in
threads; inside each extension ninja runs ``MAX_JOBS=M`` compiles; ``nvcc --threads T`` compiles the
arch targets of one file in parallel. Budget: C = min(cores, free memory / GIB_PER_JOB) compiler
processes. P = every extension at once (most have 2 translation units, so they finish fast and leave
the cores to the big one, amp_C with 15); M = C/2 so that the big extension keeps half the budget.
The start is briefly oversubscribed (up to about 2 C processes); GIB_PER_JOB is measured with that included.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# Measured (docs/build.md): apex's 12 core extensions for sm_90a at a budget of 16 used 45.7 and 49.8 GiB
# at peak in two runs (H100 host, 16 cores): 2.9-3.1 GiB per budgeted job once the start-up
# oversubscription is counted; 3.25 keeps a margin.
GIB_PER_JOB = 3.25


@dataclass(frozen=True)
class Parallelism:
    budget: int  # C: compiler processes the machine can afford
    extensions: int  # P: APEX_PARALLEL_BUILD
    max_jobs: int  # M: MAX_JOBS (ninja -j inside one extension)
    nvcc_threads: int  # T: nvcc --threads (arch targets of one file in parallel)


def budget(cores: int, free_gib: float, gib_per_job: float = GIB_PER_JOB) -> int:
    return max(1, min(cores, int(free_gib // gib_per_job)))


def plan_parallelism(budget_jobs: int, n_extensions: int, n_archs: int) -> Parallelism:
    c = max(1, budget_jobs)
    p = max(1, min(n_extensions, c))
    m = max(1, c // 2) if p > 1 else c
    # Several archs: let nvcc split them, within the budget left per compile.
    t = max(1, min(n_archs, c // max(1, m)))
    return Parallelism(c, p, m, t)


def machine_capacity() -> tuple[int, float]:
    """(usable cores, available memory in GiB) of this machine."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cores = os.cpu_count() or 1
    free_gib = 0.0
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    free_gib = int(line.split()[1]) / (1024 * 1024)
    except OSError:  # pragma: no cover - non-Linux
        free_gib = 4.0
    return cores, free_gib
