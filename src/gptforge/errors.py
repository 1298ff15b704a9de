"""Errors the CLI turns into one line and an exit code, never a traceback."""


class GptforgeError(Exception):
    """Something present is broken or an operation failed. Exit status 1."""

    exit_code = 1

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def one_line(self) -> str:
        return f"{self.message} ({self.fix})" if self.fix else self.message


class UsageError(GptforgeError):
    """The command line is wrong: a bad value, an unknown name, conflicting flags. Exit status 2."""

    exit_code = 2

    def __init__(self, flag: str | None, message: str, fix: str | None = None):
        text = f"{flag}: {message}" if flag else message
        super().__init__(text, fix)
        self.flag = flag
