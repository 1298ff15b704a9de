"""Stopping a run on SIGTERM, the notice Slurm sends before a time limit (``--signal``) or a preemption, and
the one a container gets before it is killed: the steps already queued finish, the run writes a checkpoint
and exits with PREEMPTED_EXIT, and ``--resume`` continues from it as if nothing had happened.

Every rank must stop after the same step, whichever of them the signal reached first: each step carries its
rank's flag through the all-reduce its loss goes through anyway, and the run stops once a step read back
says that any rank was asked to.
"""

from __future__ import annotations

import os
import signal
import threading

import torch

# EX_TEMPFAIL of sysexits.h: "try again later"; tasks/slurm_train.sbatch requeues the job
PREEMPTED_EXIT = 75


class StopOnSigterm:
    """Within ``with``: SIGTERM asks the run to stop; a second SIGTERM ends the process at once."""

    def __init__(self):
        self.requested = False  # this process received SIGTERM
        self.agreed = False  # a step read back says some rank did: every rank stops after the same step
        self.previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # Python handles signals there only
            self.previous = signal.signal(signal.SIGTERM, self.handle)
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None

    def handle(self, signum, frame) -> None:
        if self.requested:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        self.requested = True

    def flag(self, device: torch.device) -> torch.Tensor:
        """This rank's request as a number the step's all-reduce carries (any rank's makes the mean > 0)."""
        return torch.full((), float(self.requested), device=device)

    def read(self, value: float) -> None:
        self.agreed = self.agreed or value > 0
