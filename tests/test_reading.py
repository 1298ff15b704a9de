"""The bounded reader: every irregular, oversized, deeply nested or malformed input is one FileReadError."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import examples
from gptforge.errors import FileReadError, GptforgeError
from gptforge.reading import depth, parse_json, parse_toml, parse_yaml, read_bytes, read_json, read_toml, read_yaml

FAST = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
READERS = [read_json, read_toml, read_yaml, read_bytes]


def code_of(call, *args, **kwargs) -> str:
    with pytest.raises(FileReadError) as caught:
        call(*args, **kwargs)
    err = caught.value
    assert isinstance(err, GptforgeError) and "\n" not in err.one_line() and str(args[0]) in err.one_line()
    return err.code


@pytest.mark.parametrize("reader", READERS)
def test_irregular_files_are_refused_without_blocking(tmp_path, reader):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    done = []
    worker = threading.Thread(target=lambda: done.append(code_of(reader, fifo)), daemon=True)
    worker.start()
    worker.join(5)
    assert done == ["not-regular"]  # a FIFO with no writer: refused at once, not waited on
    assert code_of(reader, "/dev/zero") == "not-regular"  # never read: a device
    assert code_of(reader, tmp_path) == "not-regular"
    assert code_of(reader, tmp_path / "none") == "missing"
    assert code_of(reader, tmp_path / "dangling") == "missing"


@pytest.mark.parametrize("reader", READERS)
def test_a_file_over_the_cap_is_refused(tmp_path, reader):
    path = tmp_path / "big"
    path.write_bytes(b"1" * 1001)
    assert code_of(reader, path, max_bytes=1000) == "too-large"
    path.write_bytes(b"1" * 1000)
    if reader in (read_json, read_bytes):
        reader(path, max_bytes=1000)


@given(cap=st.integers(0, 4096), extra=st.integers(-64, 64), reader=st.sampled_from(READERS))
@FAST
def test_a_file_is_read_up_to_the_cap_and_no_further(tmp_path, cap, extra, reader):
    """Sizes around a generated cap: above it always too-large, at or below it never."""
    size = max(cap + extra, 0)
    path = tmp_path / "sized"
    path.write_bytes(b"1" * size)
    try:
        data = reader(path, max_bytes=cap)
    except FileReadError as err:
        assert (err.code == "too-large") == (size > cap), (size, cap, err.code)
    else:
        assert size <= cap and (reader is not read_bytes or len(data) == size)


def _irregular(path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
    else:  # a link: to a device, to a FIFO, to nothing
        target = {"link-to-device": "/dev/zero", "link-to-fifo": str(path) + ".fifo", "dangling-link": str(path) + ".none"}[kind]
        if kind == "link-to-fifo":
            os.mkfifo(target)
        path.symlink_to(target)


@given(kind=st.sampled_from(["fifo", "directory", "socket", "link-to-device", "link-to-fifo", "dangling-link"]),
       reader=st.sampled_from(READERS))
@FAST
def test_irregular_files_are_one_error_at_once(tmp_path, kind, reader):
    """Whatever is found where a file should be, the reader refuses it without opening it for long (no wait on a
    FIFO, no read of a device)."""
    path = tmp_path / f"x{len(os.listdir(tmp_path))}"
    _irregular(path, kind)
    done = []
    worker = threading.Thread(target=lambda: done.append(code_of(reader, path)), daemon=True)
    worker.start()
    worker.join(5)
    assert done and done[0] in ("not-regular", "missing", "unopenable"), (kind, done)


@given(levels=st.integers(65, 5000), opener=st.sampled_from(["[", '{"a":']))
@FAST
def test_json_nested_deeper_than_the_cap(tmp_path, levels, opener):
    closer = "]" if opener == "[" else "}"
    path = tmp_path / "deep.json"
    path.write_text(opener * levels + "1" + closer * levels)
    assert code_of(read_json, path) == "too-deep"


@given(levels=st.integers(65, 3000), form=st.sampled_from(["array", "inline", "dotted"]))
@FAST
def test_toml_nested_deeper_than_the_cap(tmp_path, levels, form):
    text = {"array": "a = " + "[" * levels + "1" + "]" * levels,
            "inline": "a = " + "{b=" * levels + "1" + "}" * levels,
            "dotted": ".".join(["k"] * levels) + " = 1"}[form]
    path = tmp_path / "deep.toml"
    path.write_text(text)
    assert code_of(read_toml, path) == "too-deep"


@given(levels=st.integers(65, 3000), flow=st.booleans())
@FAST
def test_yaml_nested_deeper_than_the_cap(tmp_path, levels, flow):
    text = ("[" * levels + "]" * levels) if flow else "".join(f"{' ' * i}k:\n" for i in range(levels)) + " " * levels + "1\n"
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    assert code_of(read_yaml, path) == "too-deep"


def test_yaml_aliases_and_tags_build_nothing(tmp_path):
    marker = tmp_path / "marker"
    laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(9))
    tagged = f"x: !!python/object/apply:os.system ['touch {marker}']\n"
    for name, text, code in (("laughs.yaml", laughs, "alias"), ("tagged.yaml", tagged, "tag")):
        (tmp_path / name).write_text(text)
        assert code_of(read_yaml, tmp_path / name) == code
    assert not marker.exists()


@pytest.mark.parametrize("data,code", [
    (b"", "syntax"), (b"{\"a\": \"\xff\"}", "not-utf8"), (b'{"a": [1, 2', "syntax"),
    (b'{"n": ' + b"9" * 5000 + b"}", "value"),
])
def test_malformed_json(tmp_path, data, code):
    (tmp_path / "f.json").write_bytes(data)
    assert code_of(read_json, tmp_path / "f.json") == code


def test_expected_top_level_type(tmp_path):
    (tmp_path / "list.json").write_text("[1, 2]")
    assert code_of(read_json, tmp_path / "list.json", expect=dict) == "type"
    assert read_json(tmp_path / "list.json", expect=list) == [1, 2]


def test_the_callers_fix_is_the_one_shown(tmp_path):
    (tmp_path / "f.json").write_text("{")
    with pytest.raises(FileReadError) as caught:
        read_json(tmp_path / "f.json", fix="regenerate it with `gptforge data prepare`")
    assert caught.value.fix == "regenerate it with `gptforge data prepare`"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=30)


@given(value=json_values)
@FAST
def test_json_within_the_bounds_round_trips(tmp_path, value):
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(value))
    assert read_json(path) == value
    assert depth(value) <= 64


@given(data=st.binary(max_size=300))
@FAST
def test_arbitrary_bytes_are_data_or_one_error(tmp_path, data):
    """Whatever the bytes, each reader returns data or raises FileReadError: never another exception."""
    text = data.decode("utf-8", "replace")
    for parse in (parse_json, parse_toml, parse_yaml):
        try:
            parse(text, "x")
        except FileReadError:
            pass
    path = tmp_path / "raw"
    path.write_bytes(data)
    for reader in READERS:
        try:
            reader(path)
        except FileReadError:
            pass
