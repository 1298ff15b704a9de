"""The console commands print tables and reports through: wrapped to the width of a terminal; written to a
pipe or a file, every row on one line, so that no wheel name, path or checksum is split and grep, cut and
diff see whole values."""

from __future__ import annotations

from rich.console import Console

UNWRAPPED_WIDTH = 100_000  # columns: wider than any row a command prints


def stdout_console(**kwargs) -> Console:
    console = Console(**kwargs)
    return console if console.is_terminal else Console(width=UNWRAPPED_WIDTH, **kwargs)
