"""Reading a structured file that may be damaged or hostile: JSON, TOML, YAML or plain bytes, from a regular
file only, bounded in size and in nesting, every failure one ``FileReadError`` naming the file.

A FIFO is opened without blocking and refused, a device is refused before a byte is read, at most
``max_bytes + 1`` bytes are read (``/dev/zero`` cannot fill memory), nesting deeper than ``max_depth`` is
refused (a parser's ``RecursionError`` included), YAML builds plain data only and refuses aliases (no
billion laughs).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tomllib
from typing import Any

from gptforge.errors import FileReadError
from gptforge.paths import mode_words

MAX_BYTES = 64 << 20
MAX_DEPTH = 64

# What to do, by what went wrong; a caller's own ``fix`` (e.g. the command that regenerates the file) wins.
_FIXES = {
    "missing": "check the path",
    "not-regular": "name a regular file",
    "unopenable": "check the path and its permissions",
    "too-large": "check that it is the right file",
    "too-deep": "check that it is the right file, or regenerate it",
    "not-utf8": "save it as UTF-8",
    "syntax": "fix it or regenerate it",
    "alias": "write the values out in full",
    "tag": "remove the tag: only plain YAML data is read",
    "value": "fix the value or regenerate the file",
    "type": "check that it is the right file",
}


def _fail(path, code: str, reason: str, fix: str | None) -> FileReadError:
    return FileReadError(path, code, reason, fix or _FIXES[code])


def read_bytes(path: str | os.PathLike, *, max_bytes: int = MAX_BYTES, fix: str | None = None) -> bytes:
    """The bytes of the regular file ``path``, refused if there are more than ``max_bytes``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        reason = "it is a broken symbolic link" if os.path.islink(path) else "not found"
        raise _fail(path, "missing", reason, fix) from None
    except OSError as err:
        raise _fail(path, "unopenable", err.strerror or type(err).__name__, fix) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _fail(path, "not-regular", f"it {mode_words(mode)}", None)
        chunks, size = [], 0
        while size <= max_bytes:
            try:
                chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            except OSError as err:  # EISDIR cannot happen (fstat said regular); EIO on a failing disk can
                raise _fail(path, "unopenable", err.strerror or errno.errorcode.get(err.errno, "read error"), fix) from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise _fail(path, "too-large", f"it is larger than {max_bytes} bytes", fix)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike, *, max_bytes: int = MAX_BYTES, fix: str | None = None) -> str:
    """The UTF-8 text of ``path``, read as ``read_bytes`` reads."""
    return decode(read_bytes(path, max_bytes=max_bytes, fix=fix), path, fix)


def decode(data: bytes, source, fix: str | None = None) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _fail(source, "not-utf8", f"not UTF-8 ({err.reason} at byte {err.start})", fix) from None


def depth(obj: Any) -> int:
    """How deeply lists and dicts nest in ``obj`` (a scalar: 0), without recursion."""
    deepest, todo = 0, [(obj, 1)]
    while todo:
        node, level = todo.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        todo.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _checked(obj: Any, source, max_depth: int, expect: type | None, fix: str | None) -> Any:
    if depth(obj) > max_depth:
        raise _fail(source, "too-deep", f"nested more than {max_depth} levels deep", fix)
    if expect is not None and not isinstance(obj, expect):
        words = {dict: "an object (a table)", list: "a list"}.get(expect, expect.__name__)
        raise _fail(source, "type", f"it holds {_kind(obj)}, expected {words}", fix)
    return obj


def _kind(obj: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(
        type(obj), f"a {type(obj).__name__}")


def parse_json(text: str | bytes, source, *, max_depth: int = MAX_DEPTH, expect: type | None = None,
               fix: str | None = None) -> Any:
    """``text`` parsed as JSON; ``source`` names it in errors (a path, ``--set``, ``FILE:LINE``)."""
    try:
        obj = json.loads(text)
    except RecursionError:
        raise _fail(source, "too-deep", f"nested more than {max_depth} levels deep", fix) from None
    except UnicodeDecodeError as err:
        raise _fail(source, "not-utf8", f"not UTF-8 ({err.reason} at byte {err.start})", fix) from None
    except json.JSONDecodeError as err:
        raise _fail(source, "syntax", f"malformed JSON ({err.msg} at line {err.lineno} column {err.colno})", fix) from None
    except ValueError as err:  # an integer of more than sys.get_int_max_str_digits() digits
        raise _fail(source, "value", f"unreadable JSON value ({str(err).split(';')[0][:120]})", fix) from None
    return _checked(obj, source, max_depth, expect, fix)


def parse_toml(text: str, source, *, max_depth: int = MAX_DEPTH, expect: type | None = dict,
               fix: str | None = None) -> Any:
    try:
        obj = tomllib.loads(text)
    except RecursionError:
        raise _fail(source, "too-deep", f"nested more than {max_depth} levels deep", fix) from None
    except tomllib.TOMLDecodeError as err:
        raise _fail(source, "syntax", f"malformed TOML ({str(err)[:160]})", fix) from None
    except ValueError as err:
        raise _fail(source, "value", f"unreadable TOML value ({str(err).split(';')[0][:120]})", fix) from None
    return _checked(obj, source, max_depth, expect, fix)


def parse_yaml(text: str, source, *, max_depth: int = MAX_DEPTH, expect: type | None = None,
               fix: str | None = None) -> Any:
    """Plain YAML data (no tags that build objects); nesting checked on the event stream before anything is
    built, aliases refused (an alias of an alias of ... is the billion laughs)."""
    import yaml  # only the lock commands read YAML; pyyaml comes with their extra

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        level = 0
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.AliasEvent):
                raise _fail(source, "alias", f"it uses a YAML alias (*{event.anchor})", fix)
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                level += 1
                if level > max_depth:
                    raise _fail(source, "too-deep", f"nested more than {max_depth} levels deep", fix)
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                level -= 1
        obj = yaml.load(text, Loader=loader)
    except RecursionError:
        raise _fail(source, "too-deep", f"nested more than {max_depth} levels deep", fix) from None
    except yaml.constructor.ConstructorError as err:
        raise _fail(source, "tag", f"it holds a YAML tag that is not plain data ({_yaml_reason(err)})", fix) from None
    except yaml.YAMLError as err:
        if "nesting depth" in str(getattr(err, "problem", "")):  # libyaml's own limit, met before ours
            raise _fail(source, "too-deep", f"nested more than {max_depth} levels deep", fix) from None
        raise _fail(source, "syntax", f"malformed YAML ({_yaml_reason(err)})", fix) from None
    except ValueError as err:
        raise _fail(source, "value", f"unreadable YAML value ({str(err).split(';')[0][:120]})", fix) from None
    return _checked(obj, source, max_depth, expect, fix)


def _yaml_reason(err) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
    return f"{getattr(err, 'problem', None) or type(err).__name__}{where}"[:160]


def read_json(path: str | os.PathLike, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH,
              expect: type | None = None, fix: str | None = None) -> Any:
    """The JSON file ``path``, bounded (module docstring); ``expect``: the type its top level must have."""
    return parse_json(read_bytes(path, max_bytes=max_bytes, fix=fix), path, max_depth=max_depth, expect=expect, fix=fix)


def read_toml(path: str | os.PathLike, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH,
              fix: str | None = None) -> dict:
    return parse_toml(read_text(path, max_bytes=max_bytes, fix=fix), path, max_depth=max_depth, fix=fix)


def read_yaml(path: str | os.PathLike, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH,
              expect: type | None = None, fix: str | None = None) -> Any:
    return parse_yaml(read_text(path, max_bytes=max_bytes, fix=fix), path, max_depth=max_depth, expect=expect, fix=fix)
