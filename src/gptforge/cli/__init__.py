"""Command-line entry point: argument parsing only; every command is a library function.

Each command module exposes ``register(subparsers, groups)`` and sets ``func`` on its parser;
``func(args)`` returns the exit status. ``groups`` shares two-word command groups
(``build apex``, ``data inspect``) between modules.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gptforge import __version__
from gptforge.errors import GptforgeError, UsageError, printable

COMMAND_MODULES = ("compat", "doctor", "links", "data", "build", "train", "sample", "lock")
# Which modules register each top-level command: a command imports only its own modules, so that
# `gptforge fix-links` (run on every environment activation) does not pay for torch or the trainer.
MODULES_OF_COMMAND = {
    "compat": ("compat",),
    "doctor": ("doctor",),
    "fix-links": ("links",),
    "prepare": ("data",),
    "data": ("data",),
    "build": ("build",),
    "train": ("train",),
    "sample": ("sample",),
    "lock": ("lock",),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit status 2.

    Abbreviated long options are refused: scripts written against ``--json`` must not start meaning
    something else when a later release adds ``--json-schema``. ``intermixed=True`` (``add_parser`` passes
    it on) lets positionals such as KEY=VALUE overrides sit before, between and after options; argparse
    alone takes one run of them.
    """

    def __init__(self, *args, intermixed: bool = False, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._intermixed = intermixed

    def parse_known_args(self, args=None, namespace=None):
        if not self._intermixed:
            return super().parse_known_args(args, namespace)
        self._intermixed = False  # parse_known_intermixed_args parses through this method, twice
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixed = True

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        sys.stderr.write(printable(f"{self.prog}: error: {message} (see '{self.prog} --help')") + "\n")
        raise SystemExit(2)


def group(subparsers, groups: dict, name: str, help: str):
    """The sub-subparsers of a two-word command group, created on first use."""
    if name not in groups:
        parser = subparsers.add_parser(name, help=help, description=help)
        groups[name] = parser.add_subparsers(dest=f"{name}_command", metavar="COMMAND", required=True)
    return groups[name]


def modules_for(argv: list[str]) -> tuple[str, ...]:
    """The command modules to load: the named command's own, or all of them (help, typos)."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return MODULES_OF_COMMAND.get(first, COMMAND_MODULES)


def build_parser(modules: tuple[str, ...] = COMMAND_MODULES) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="gptforge",
        description="Locked GPU environments for GPT pretraining, and the pretraining package that runs in them.",
    )
    parser.add_argument("--version", action="version", version=f"gptforge {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=OneLineParser)
    groups: dict = {}
    for name in modules:
        importlib.import_module(f"gptforge.cli.{name}").register(subparsers, groups)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(modules_for(argv))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except GptforgeError as err:
        kind = "usage error" if isinstance(err, UsageError) else "error"
        sys.stderr.write(f"gptforge: {kind}: {err.one_line()}\n")
        return err.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("gptforge: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
