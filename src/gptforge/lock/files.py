"""Writing the lock's files: whole or not at all (a temp name in the same directory, then a rename)."""

from __future__ import annotations

from pathlib import Path

from gptforge.storage import write_atomic


def write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode())


# Until the package's one bounded reader lands, the lock's reads go through these two.
MAX_BYTES = 64 << 20


def read_text(path: Path, what: str) -> str:
    """A regular file's text, at most MAX_BYTES (a FIFO never blocks, /dev/zero is never read)."""
    import os
    import stat

    from gptforge.errors import GptforgeError

    fix = f"pass the path of a {what}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise GptforgeError(f"cannot read {path}: {err.strerror}", fix) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GptforgeError(f"cannot read {path}: not a regular file", fix)
        data = os.read(fd, MAX_BYTES + 1)
        while len(data) <= MAX_BYTES and (more := os.read(fd, MAX_BYTES + 1 - len(data))):
            data += more
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise GptforgeError(f"cannot read {path}: larger than {MAX_BYTES} bytes", fix)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise GptforgeError(f"cannot read {path}: not UTF-8 text", fix) from None


def read_toml(path: Path, what: str = "pixi.toml") -> dict:
    import tomllib

    from gptforge.errors import GptforgeError

    try:
        return tomllib.loads(read_text(path, what))
    except (tomllib.TOMLDecodeError, RecursionError) as err:
        raise GptforgeError(f"cannot read {path}: malformed TOML ({str(err)[:120]})", f"fix the {what}") from None


def read_yaml(path: Path, what: str = "pixi.lock"):
    """Plain YAML data: no tags that build objects, no aliases (the billion laughs)."""
    import yaml

    from gptforge.errors import GptforgeError

    text = read_text(path, what)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        if any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(text, Loader=loader)):
            raise GptforgeError(f"cannot read {path}: it uses a YAML alias", f"regenerate the {what}")
        return yaml.load(text, Loader=loader)
    except (yaml.YAMLError, RecursionError, ValueError) as err:
        first = str(err).strip().splitlines()[0][:120] if str(err).strip() else type(err).__name__
        raise GptforgeError(f"cannot read {path}: malformed YAML ({first})", f"regenerate the {what}") from None


def read_json(path: Path, what: str):
    import json

    from gptforge.errors import GptforgeError

    try:
        return json.loads(read_text(path, what))
    except (ValueError, RecursionError) as err:
        raise GptforgeError(f"cannot read {path}: malformed JSON ({str(err)[:120]})", f"restore the {what}") from None
