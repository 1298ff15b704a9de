"""CLI for the doctor commands (placeholder until implemented: registers nothing)."""


def register(subparsers, groups) -> None:
    pass
