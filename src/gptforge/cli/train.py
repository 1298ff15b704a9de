"""CLI for the train commands (placeholder until implemented: registers nothing)."""


def register(subparsers, groups) -> None:
    pass
