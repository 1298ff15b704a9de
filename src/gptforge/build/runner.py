"""Run a long build command: everything it prints goes to a log file, a progress line goes to the terminal.

The log is written as the build runs, so it survives a closed terminal; SIGHUP is ignored during the
build, so closing the terminal does not stop the compile either (the terminal output just stops).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from gptforge.errors import GptforgeError

NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")
EXT_START = re.compile(r"building '([\w.]+)' extension")
EXT_LINKED = re.compile(r"-o \S*/([A-Za-z_][\w]*)\.cpython-[^ /]*\.so\b|-o \S*/([A-Za-z_]\w*)\.abi3\.so\b")


@dataclass
class BuildProgress:
    """What a setuptools + ninja build log says so far."""

    started: list[str] = field(default_factory=list)
    linked: list[str] = field(default_factory=list)
    steps_done: int = 0

    def feed(self, line: str) -> None:
        if m := EXT_START.search(line):
            if m.group(1) not in self.started:
                self.started.append(m.group(1))
        elif NINJA_STEP.match(line.strip()):
            self.steps_done += 1
        if (m := EXT_LINKED.search(line)) and ("-shared" in line):
            name = m.group(1) or m.group(2)
            if name not in self.linked:
                self.linked.append(name)

    def describe(self, expected: int | None) -> str:
        total = max(expected or 0, len(self.started))
        return f"{len(self.linked)}/{total or '?'} extensions linked, {self.steps_done} compile steps done"


@contextmanager
def ignore_hangup():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN) if hasattr(signal, "SIGHUP") else None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGHUP, previous)


def run_logged(cmd: list[str], *, env: dict, cwd: Path, log: Path, title: str, expected: int | None = None,
               quiet: bool = False) -> float:
    """Run ``cmd``; return its wall time. On failure raise with the log's last error lines."""
    log.parent.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    progress = BuildProgress()
    start = time.monotonic()
    with ignore_hangup(), open(log, "w", buffering=1) as out:
        out.write(f"# {' '.join(cmd)}\n# cwd: {cwd}\n")
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", bufsize=1)
        status = None if quiet or not sys.stderr.isatty() else console.status(title)
        if status:
            status.start()
        last_note = 0.0
        try:
            for line in proc.stdout:
                out.write(line)
                progress.feed(line)
                now = time.monotonic()
                text = f"{title}: {progress.describe(expected)}, {now - start:.0f} s"
                if status:
                    status.update(text)
                elif not quiet and now - last_note > 30:  # a line every 30 s when not on a terminal
                    _note(console, text)
                    last_note = now
            proc.wait()
        finally:
            if status:
                status.stop()
            if proc.poll() is None:
                proc.kill()
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        raise GptforgeError(f"{title} failed (exit {proc.returncode}): {last_error(log)}", f"full log: {log}")
    if not quiet:
        _note(console, f"{title}: done in {elapsed:.0f} s ({progress.describe(expected)})")
    return elapsed


def _note(console: Console, text: str) -> None:
    try:
        console.print(text, highlight=False)
    except OSError:  # the terminal went away; the log file still has everything
        pass


PY_EXCEPTION = re.compile(r"^\s*(\w+(?:Error|Exception)|CUDAMismatchException): ")
COMPILE_ERROR = re.compile(r"(\berror\b:|fatal error|FAILED: |undefined reference)")


def last_error(log: Path) -> str:
    """The most telling line of a failed build: a Python exception, else the first compiler error."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines()]
    python = [ln for ln in lines if PY_EXCEPTION.match(ln)]
    compiler = [ln for ln in lines if COMPILE_ERROR.search(ln) and "subprocess-exited-with-error" not in ln]
    pick = python[-1] if python else (compiler[0] if compiler else (lines[-1] if lines else "no output"))
    return pick[:400]
