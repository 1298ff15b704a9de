"""Every command block of README.md and docs/*.md runs, in order, in a fresh clone of the repository.

A fresh clone (``git clone`` of this checkout at HEAD into a temporary directory, so commit first)
is what a new user has. Each Markdown file gets its own clone; its blocks run top to bottom in it,
so a later block may use what an earlier one made (``data/stdlib`` before ``data inspect``).

What counts as a command block: an indented or fenced code block (no language, or bash / sh /
shell / console) whose first command starts with a program: one on PATH, an executable file of the
clone, ``.venv/bin/X`` or a launcher this machine may lack (pixi, torchrun, deepspeed, srun,
sbatch). Other blocks (file layouts, error output, Python) are text. In a block with ``$ `` prompts
only the prompted lines are commands; the rest is their output. Lines that are synopses, not
commands (an optional ``[--flag]`` or an upper-case placeholder such as ``PATH`` or ``DIR``), are
not run. A command is expected to exit 0 unless it says otherwise in a trailing comment:
``# exit status 1``.

Markers, an HTML comment on the line before a block, for blocks this machine cannot run:

    <!-- gpu -->        needs an NVIDIA GPU: runs only under ``pytest -m gpu``
    <!-- network -->    downloads something: never run here
    <!-- slow -->       takes minutes: runs only under ``pytest -m slow``
    <!-- long -->       a full-length run, or more GPUs or nodes than a test machine has: never run here

The test uses its own environment instead of making one: ``python3 -m venv .venv`` is not run,
``.venv/bin/X`` runs this interpreter's ``X``, ``pip install`` lines are not run (the test
environment is what they install), lines that run pytest are not run (this test is part of that
run), and lines that need pixi are skipped with "no pixi here" when pixi is not on PATH. Commands
run with one OpenMP thread (on a shared, loaded machine torch's spinning threads make a CPU run
ten times slower). At the end
the clone's ``git status`` must be clean: everything the commands wrote is git-ignored.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
LAUNCHERS = {"pixi", "torchrun", "deepspeed", "srun", "sbatch"}
MARKERS = ("gpu", "network", "slow", "long")
MARKER = re.compile(r"<!--\s*(" + "|".join(MARKERS) + r")\s*-->")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(\.\.\.)?$")
EXIT_STATUS = re.compile(r"#\s*exit status (\d+)\s*$")
COMMAND_TIMEOUT = 600


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass
class Block:
    line: int  # 1-based line of the block in its file
    text: str
    marker: str | None


def code_blocks(markdown: str) -> list[Block]:
    """Shell-like code blocks with the marker comment just before each (markdown-it, CommonMark)."""
    from markdown_it import MarkdownIt

    blocks, marker, previous_end = [], None, None
    for token in MarkdownIt("commonmark").parse(markdown):
        if token.map is None:
            continue
        if token.type == "html_block":
            found = MARKER.search(token.content)
            marker, previous_end = (found.group(1) if found else None), token.map[1]
            continue
        if token.type in ("fence", "code_block"):
            language = token.info.strip().split()[0] if token.info.strip() else ""
            attached = marker if previous_end is not None and token.map[0] - previous_end <= 1 else None
            if language in SHELL_LANGUAGES:
                blocks.append(Block(token.map[0] + 1, token.content, attached))
        marker, previous_end = None, None
    return blocks


def logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        current += raw.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        lines.append(current.strip())
        current = ""
    return [line for line in lines if line]


def commands_of(block: Block) -> list[str]:
    lines = logical_lines(block.text)
    if any(line.startswith("$ ") for line in lines):
        return [line[2:].strip() for line in lines if line.startswith("$ ")]
    return [line for line in lines if not line.startswith("#")]


def words(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return command.split()


def program(command: str) -> str:
    """The first word after leading VAR=value assignments."""
    parts = words(command)
    while parts and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", parts[0]):
        parts = parts[1:]
    return parts[0] if parts else ""


def is_program(name: str, clone: Path) -> bool:
    if name.startswith(".venv/bin/") or name in LAUNCHERS:
        return True
    if "/" in name:
        return os.access(clone / name, os.X_OK) and (clone / name).is_file()
    return shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}") is not None


def why_not_run(command: str, marker: str | None, mode: str) -> str | None:
    """The reason a command is not run in this mode, or None to run it."""
    parts, name = words(command), program(command)
    if marker in ("network", "long"):
        return marker
    if marker == "gpu" and mode != "gpu":
        return "gpu"
    if marker == "slow" and mode == "default":
        return "slow"
    if any(part.startswith("[-") for part in parts) or any(PLACEHOLDER.match(part) for part in parts[1:]):
        return "synopsis"
    if name == "pixi" and shutil.which("pixi") is None:
        return "no pixi here"
    if parts[:3] == ["python3", "-m", "venv"] or parts[1:3] == ["-m", "venv"]:
        return "the test's own environment stands in for .venv"
    if "pip" in Path(name).name and "install" in parts:
        return "package install: the test environment has the packages"
    if "pytest" in parts or Path(name).name == "pytest":
        return "runs the test suite, which this test is part of"
    return None


def run_command(command: str, clone: Path) -> subprocess.CompletedProcess:
    command = command.replace(".venv/bin/", f"{BIN}/")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=COMMAND_TIMEOUT)


def fresh_clone(tmp_path: Path) -> Path:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, capture_output=True)
    return clone


def run_file(markdown: Path, clone: Path, mode: str) -> tuple[list[str], list[str]]:
    """(commands run, failures) for one file's blocks, in order."""
    ran, failures = [], []
    for block in code_blocks(markdown.read_text()):
        commands = commands_of(block)
        if not commands or not is_program(program(commands[0]), clone):
            continue  # text, not commands
        for command in commands:
            if why_not_run(command, block.marker, mode):
                continue
            expected = int(m.group(1)) if (m := EXIT_STATUS.search(command)) else 0
            proc = run_command(command, clone)
            ran.append(command)
            if proc.returncode != expected:
                failures.append(f"{markdown.name}:{block.line}: `{command}` exited {proc.returncode}, expected "
                                f"{expected}\n{(proc.stdout + proc.stderr)[-1500:]}")
    return ran, failures


def _is_git_checkout() -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode == 0


FILES = [pytest.param(p, id=p.relative_to(ROOT).as_posix()) for p in markdown_files()]
MODES = [pytest.param("default"), pytest.param("slow", marks=pytest.mark.slow),
         pytest.param("gpu", marks=pytest.mark.gpu)]


@pytest.mark.skipif(not _is_git_checkout(), reason="not a git checkout: nothing to clone")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("markdown", FILES)
def test_command_blocks_run_in_a_fresh_clone(markdown, mode, tmp_path):
    clone = fresh_clone(tmp_path)
    ran, failures = run_file(clone / markdown.relative_to(ROOT), clone, mode)
    assert not failures, "\n\n".join(failures)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=clone,
                            capture_output=True, text=True, check=True).stdout
    assert status == "", f"after {ran}, outputs that .gitignore does not cover:\n{status}"


# --- the parser itself -------------------------------------------------------------------------

SAMPLE = """\
Text.

    gptforge prepare --default-corpus data/stdlib     # a comment
    gptforge data inspect data/stdlib/stdlib_docs_text_document

<!-- gpu -->
```bash
gptforge build apex \\
    --jobs 4
```

```
$ gptforge compat check --cc 99.1      # exit status 2
gptforge compat check: error: ...
```

    src/gptforge/compat/   version facts

```python
print("not shell")
```
"""


def test_blocks_markers_transcripts_and_continuations():
    blocks = code_blocks(SAMPLE)
    assert [(b.line, b.marker) for b in blocks] == [(3, None), (7, "gpu"), (12, None), (17, None)]
    assert commands_of(blocks[1]) == ["gptforge build apex      --jobs 4"]
    assert commands_of(blocks[2]) == ["gptforge compat check --cc 99.1      # exit status 2"]
    assert EXIT_STATUS.search(commands_of(blocks[2])[0]).group(1) == "2"
    assert not is_program(program(commands_of(blocks[3])[0]), ROOT)  # a layout listing is text


@pytest.mark.parametrize("command,mode,reason", [
    ("gptforge build apex", "default", None),
    ("pixi run setup", "default", "no pixi here" if shutil.which("pixi") is None else None),
    ("python3 -m venv .venv", "default", "the test's own environment stands in for .venv"),
    (".venv/bin/pip install -e '.[test]'", "default", "package install: the test environment has the packages"),
    (".venv/bin/python -m pytest", "default", "runs the test suite, which this test is part of"),
    ("gptforge doctor [--json] [--strict]", "default", "synopsis"),
    ("gptforge fix-links --prefix ENV --dry-run", "default", "synopsis"),
    ("MEGATRON_LM_SRC=path/to/Megatron-LM python bench/data_megatron.py", "default", None),
])
def test_which_lines_are_not_run(command, mode, reason):
    assert why_not_run(command, None, mode) == reason


def test_markers_choose_the_mode():
    assert why_not_run("gptforge build apex", "gpu", "default") == "gpu"
    assert why_not_run("gptforge build apex", "gpu", "gpu") is None
    assert why_not_run("gptforge train", "slow", "default") == "slow"
    assert why_not_run("gptforge train", "slow", "slow") is None
    assert why_not_run("pip download x", "network", "gpu") == "network"
    assert why_not_run("torchrun --nproc-per-node 8 -m gptforge train", "long", "gpu") == "long"
