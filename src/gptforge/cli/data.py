"""CLI for the data commands (placeholder until implemented: registers nothing)."""


def register(subparsers, groups) -> None:
    pass
