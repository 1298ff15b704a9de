"""Run a helper program with a deadline, and on the deadline kill it with everything it started."""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gptforge.errors import UsageError


@dataclass(frozen=True)
class Outcome:
    code: int  # -1 when it could not start or timed out
    stdout: str
    stderr: str  # the reason when it could not start or timed out


def split_command(text: str, name: str) -> list[str]:
    """A command held in an environment variable (``CXX="ccache g++"``) as argv: shell quoting, not blanks."""
    fix = f"set {name} to a compiler command, e.g. {name}=g++, or unset it"
    try:
        argv = shlex.split(text)
    except ValueError as err:
        raise UsageError(name, f"{text!r} is not a command ({err})", fix) from None
    if not argv:
        raise UsageError(name, f"{text!r} names no command", fix)
    return argv


def run_bounded(args: list[str], timeout: float) -> Outcome:
    """``args`` in a session of its own: a wrapper script's children (``gcc`` under a ``cc`` script) are killed
    with it at the deadline instead of being left behind holding the pipes open."""
    try:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace", start_new_session=True)
    except (OSError, ValueError) as err:
        return Outcome(-1, "", str(err))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        return Outcome(-1, "", f"timed out after {timeout:g} s (killed)")
    return Outcome(proc.returncode, out, err)


TOOL_TIMEOUT_S = 10  # `--version` of nvcc or a compiler answers in well under a second; probes run in parallel


def run_tool(args: list[str]) -> tuple[int, str, str]:
    """A tool asked about itself (nvcc, a compiler): (exit status, stdout, stderr); never raises, gives up after
    a short timeout, reads output that is not UTF-8. Status -1 with the reason as stderr when it cannot run."""
    done = run_bounded(args, TOOL_TIMEOUT_S)
    return done.code, done.stdout, done.stderr


def _state_and_parent(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent from /proc; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def process_tree(pid: int) -> list[int]:
    """PID and every live process below it (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in glob.glob("/proc/[0-9]*"):
        child = int(entry.rsplit("/", 1)[1])
        found = _state_and_parent(child)
        if found and found[0] != "Z":
            children.setdefault(found[1], []).append(child)
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def kill_tree(pid: int, wait_s: float = 60) -> None:
    """SIGKILL PID and every process under it, also those in sessions of their own (torchrun's workers), and
    wait until those under it are gone; PID itself is its parent's to reap (Popen.wait)."""
    tree = process_tree(pid)
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while any((found := _state_and_parent(member)) and found[0] != "Z" and member != pid for member in tree):
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes {tree} still run {wait_s:.0f} s after SIGKILL")
        time.sleep(0.1)
