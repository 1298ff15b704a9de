"""The training progress bar: one tick per micro-step, so a slow device shows progress and an ETA at once.

The ETA is the mean time of the micro-steps so far (validation excluded) times the ones left; rich's
own remaining-time column needs two updates before it says anything, which on a CPU can be minutes.
Shown on a terminal only (logs piped to a file keep their plain lines).
"""

from __future__ import annotations

import datetime
import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn


def eta_text(seconds: float) -> str:
    return "ETA " + str(datetime.timedelta(seconds=round(seconds)))


class RunProgress:
    def __init__(self, console, *, enabled: bool, total: int, done: int = 0):
        self.total, self.done = total, done
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[eta]}"), TextColumn("{task.fields[info]}"), console=console,
                            disable=not (enabled and console.is_terminal), transient=True)
        self.spent, self.ticks = 0.0, 0
        self.last = time.perf_counter()

    def __enter__(self) -> "RunProgress":
        self.bar.__enter__()
        self.task = self.bar.add_task("train micro-steps", total=self.total, completed=self.done, eta="", info="")
        self.last = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def advance(self) -> None:
        now = time.perf_counter()
        self.spent, self.last = self.spent + (now - self.last), now
        self.ticks += 1
        self.done += 1
        self.bar.update(self.task, completed=self.done, eta=eta_text(self.seconds_left()))

    def seconds_left(self) -> float:
        return self.spent / self.ticks * (self.total - self.done) if self.ticks else float("nan")

    def info(self, text: str) -> None:
        self.bar.update(self.task, info=text)

    def validation(self, batches: int):
        """A callback for each validation batch, shown as its own bar; its time is not counted in the ETA."""
        task = self.bar.add_task("validation", total=batches, eta="", info="")
        seen = 0

        def tick() -> None:
            nonlocal seen
            seen += 1
            self.bar.advance(task)
            if seen == batches:
                self.bar.remove_task(task)
                self.last = time.perf_counter()

        return tick
