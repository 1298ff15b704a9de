"""CLI for the build commands (placeholder until implemented: registers nothing)."""


def register(subparsers, groups) -> None:
    pass
