"""CLI for the compat commands (placeholder until implemented: registers nothing)."""


def register(subparsers, groups) -> None:
    pass
