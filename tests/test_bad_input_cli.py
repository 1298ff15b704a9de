"""Bad input across commands: one line on stderr, the right exit status, no traceback, no hang."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import gptforge_executable, run_cli


def one_line_error(proc, code: int, *needles: str) -> str:
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip("\n").split("\n")
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def corpus(tmp_path):
    def write(*lines: str) -> Path:
        path = tmp_path / "c.jsonl"
        path.write_text("".join(line + "\n" for line in ['{"text": "hello world, hello there"}', *lines]))
        return path
    return write


@pytest.mark.parametrize("line,needle", [
    ("[" * 100_000 + "]" * 100_000, "c.jsonl:2: JSON nested too deeply to read"),
    ('{"text": "a", "n": ' + "9" * 5000 + "}", "c.jsonl:2: unreadable JSON value (Exceeds the limit (4300 digits)"),
    ('{"text": "a \\ud800 b"}', "c.jsonl:2: key 'text' holds a lone surrogate \\ud800 at character 2"),
])
@pytest.mark.parametrize("skip", [False, True])
def test_bad_json_lines(tmp_path, corpus, line, needle, skip):
    path = corpus(line)
    args = ["prepare", "--input", str(path), "--output-prefix", str(tmp_path / "out"), "--tokenizer", "bytelevel",
            "--vocab-size", "300", "--json"]
    proc = run_cli(*args, *(["--skip-bad-lines"] if skip else []))
    if skip:
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["skipped_lines"] == 1 and needle in report["first_skipped"][0]
    else:
        one_line_error(proc, 1, needle)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_inputs_that_are_not_regular_files(tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "nowhere")
    for path, needle in (("/dev/zero", "/dev/zero is a character device, not a regular file"),
                         (str(fifo), "pipe.jsonl is a FIFO (named pipe), not a regular file"),
                         (str(tmp_path / "dangling.jsonl"), "dangling.jsonl is a broken symbolic link"),
                         (str(tmp_path / "none.jsonl"), "none.jsonl not found")):
        proc = run_cli("prepare", "--input", path, "--format", "jsonl", "--output-prefix", str(tmp_path / "o"))
        one_line_error(proc, 2, "--input: ", needle)


@pytest.mark.parametrize("name", ["x\n", "a\x1b[31mred\x1b[0m", "line\u2028sep"])
def test_control_characters_in_a_path_are_escaped(tmp_path, name):
    """A value ending in a newline gave a two-line error; escape sequences reached the terminal raw."""
    proc = run_cli("prepare", "--input", str(tmp_path / name), "--output-prefix", str(tmp_path / "o"))
    line = one_line_error(proc, 2, "not found")
    assert "\x1b" not in line and "\u2028" not in line
    assert name.encode("unicode_escape").decode() in line


def test_default_corpus_refuses_input(tmp_path, corpus):
    proc = run_cli("prepare", "--default-corpus", str(tmp_path / "dc"), "--input", str(corpus()))
    one_line_error(proc, 2, "--default-corpus: prepares the embedded corpus only; --input and --output-prefix")
    assert not (tmp_path / "dc").exists()


@pytest.mark.parametrize("size,needle", [("99999999999", "99999999999 is larger than 1,048,576"),
                                         ("100", "100 is too small")])
def test_vocab_size_is_checked_before_training(tmp_path, corpus, size, needle):
    """99999999999 reached the Rust trainer, which aborted with a 56-line backtrace."""
    proc = run_cli("prepare", "--input", str(corpus()), "--output-prefix", str(tmp_path / "o"),
                   "--tokenizer", "bytelevel", "--vocab-size", size)
    one_line_error(proc, 2, "--vocab-size: ", needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def _hanging_tool(path: Path) -> None:
    """A wrapper script that starts a child and hangs: what a broken compiler wrapper does."""
    path.write_text(f"#!/bin/sh\necho $$ >> {path.parent}/pids\nsleep 600 &\necho $! >> {path.parent}/pids\nsleep 600\n")
    path.chmod(0o755)


def test_doctor_with_hanging_compilers_reports_them_and_leaves_nothing_running(tmp_path):
    tools = tmp_path / "bin"
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    tools.mkdir()
    for name in ("gcc", "g++", "cc", "c++", "nvcc"):
        _hanging_tool(tools / name)
    _hanging_tool(tmp_path / "cuda" / "bin" / "nvcc")
    env = {"PATH": f"{tools}:{os.environ['PATH']}", "CUDA_HOME": str(tmp_path / "cuda"), "CC": str(tools / "cc"),
           "CXX": str(tools / "c++")}
    proc = run_cli("doctor", "--json", env=env, timeout=300)
    report = json.loads(proc.stdout)
    messages = {f["code"]: [] for f in report["findings"]}
    for f in report["findings"]:
        messages[f["code"]].append(f["message"])
    timed_out = [m for m in messages.get("compiler-broken", []) if "timed out after 10 s (killed)" in m]
    assert {m.split("'")[1] for m in timed_out} >= {str(tools / "cc"), str(tools / "c++"), "gcc", "g++"}, messages
    assert sum("timed out" in m for m in messages.get("nvcc-broken", [])) == 2, messages
    pids = [int(p) for p in (tools / "pids").read_text().split() + (tmp_path / "cuda" / "bin" / "pids").read_text().split()]
    time.sleep(0.5)
    alive = [p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2]]
    assert not alive, "processes left running: " + ", ".join(Path(f"/proc/{p}/cmdline").read_text() for p in alive)


# the parser's second case is test_helpers_build.py's test_cxx_that_is_not_a_command in the default run (its CXX)
@pytest.mark.parametrize("value,needle", [("  ", "CC: '  ' names no command"),
                                          pytest.param('gcc "-O2', "CC: 'gcc \"-O2' is not a command "
                                                       "(No closing quotation)", marks=pytest.mark.slow)])
def test_doctor_with_a_compiler_variable_that_is_not_a_command(value, needle):
    proc = run_cli("doctor", "--json", env={"CC": value}, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    messages = [f["message"] for f in json.loads(proc.stdout)["findings"] if f["code"] == "compiler-broken"]
    assert any(needle in m for m in messages), messages


def test_unreadable_target_headers_for_a_user_who_cannot_list_them():
    """Run as a user who cannot list targets/x86_64-linux/include (as root: as 'nobody' through setpriv)."""
    as_root = os.geteuid() == 0
    if as_root and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: no way to be a user the permission bits stop")
    prefix = Path(tempfile.mkdtemp(prefix="gptforge-prefix-", dir="/tmp"))
    try:
        prefix.chmod(0o755)
        for sub in ("lib", "include", "conda-meta", "targets/x86_64-linux/include"):
            (prefix / sub).mkdir(parents=True)
            (prefix / sub).chmod(0o755)
        (prefix / "targets").chmod(0o755)
        (prefix / "targets" / "x86_64-linux").chmod(0o755)
        (prefix / "targets/x86_64-linux/include/cuda_runtime.h").write_text("")
        (prefix / "conda-meta" / "cuda-version-12.8-0.json").write_text('{"version": "12.8"}')
        (prefix / "targets/x86_64-linux/include").chmod(0)
        command = [*gptforge_executable(), "fix-links", "--prefix", str(prefix), "--dry-run", "--json"]
        if as_root:
            command = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *command]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        codes = {f["code"]: f["message"] for f in json.loads(proc.stdout)["findings"]}
        assert "(Permission denied)" in codes["links-headers-unreadable"]
    finally:
        (prefix / "targets/x86_64-linux/include").chmod(stat.S_IRWXU)
        shutil.rmtree(prefix)
