"""Errors the CLI turns into one line and an exit code, never a traceback."""

import re

# Control characters, line and paragraph separators and lone surrogates: a path or value holding one
# must not move the cursor, recolour the terminal or split the message over two lines.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


# A word longer than this (a hostile value, a pasted blob) is shown by its ends: the line stays one readable line.
LONGEST_WORD = 200
_LONG_WORD = re.compile(rf"\S{{{LONGEST_WORD + 1},}}")


def printable(text: str) -> str:
    """``text`` with every unprintable character written as its Python escape (``\\n``, ``\\x1b``), and every
    word of more than LONGEST_WORD characters cut to its ends."""
    escaped = _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
    return _LONG_WORD.sub(lambda m: f"{m.group()[:120]}...[{len(m.group()) - 160} characters]...{m.group()[-40:]}", escaped)


class GptforgeError(Exception):
    """Something present is broken or an operation failed. Exit status 1."""

    exit_code = 1

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def one_line(self) -> str:
        return printable(f"{self.message} ({self.fix})" if self.fix else self.message)


class UsageError(GptforgeError):
    """The command line is wrong: a bad value, an unknown name, conflicting flags. Exit status 2."""

    exit_code = 2

    def __init__(self, flag: str | None, message: str, fix: str | None = None):
        text = f"{flag}: {message}" if flag else message
        super().__init__(text, fix)
        self.flag = flag


class FileReadError(GptforgeError):
    """A file could not be read as what it should be. ``code``: missing, not-regular, unopenable, too-large,
    too-deep, not-utf8, syntax, alias, tag, value or type (``gptforge.reading`` raises them all)."""

    def __init__(self, path, code: str, reason: str, fix: str | None = None):
        super().__init__(f"cannot read {path}: {reason}", fix)
        self.path = path
        self.code = code
