"""CLI for the links commands (placeholder until implemented: registers nothing)."""


def register(subparsers, groups) -> None:
    pass
