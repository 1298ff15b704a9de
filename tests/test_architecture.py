"""Every import in src/gptforge goes a way docs/architecture.md allows, and no two modules import each other.

The allowed directions are read from the table in docs/architecture.md, so the page and the check
cannot disagree. Imports are read with ``ast``: those inside functions count as much as those at the top.
"""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "gptforge"
ENTRY_POINT = "__main__"  # gptforge/__main__.py and a package's __main__.py may import the cli


def allowed_imports() -> dict[str, set[str]]:
    """package -> the packages it may import, from the table in docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\w+) \| .+ \| ([\w, ]+) \|$", text, re.MULTILINE)
    return {package: {p.strip() for p in allowed.split(",")} for package, allowed in rows[1:]}  # [0]: the header


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """gptforge.compat.rules -> compat; gptforge.errors and gptforge itself -> base."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (SRC / parts[1]).is_dir() else "base"


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, gptforge name) for every import of gptforge in ``source``, relative ones resolved; a name
    from ``from M import N`` is M.N, a module or not."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join(anchor + ([base] if base else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name == "gptforge" or name.startswith("gptforge.")]


def violations(source: str, module: str, is_package: bool, allowed: dict[str, set[str]]) -> list[str]:
    package = package_of(module)
    entry = module.rsplit(".", 1)[-1] == ENTRY_POINT
    may = allowed[package] | {package} | ({"cli"} if entry else set())
    return [f"{module}:{line} imports {name} ({package} may import {', '.join(sorted(allowed[package]))})"
            for line, name in imported_modules(source, module, is_package) if package_of(name) not in may]


def source_modules() -> list[tuple[str, str, bool]]:
    return [(module_name(p), p.read_text(encoding="utf-8"), p.name == "__init__.py") for p in sorted(SRC.rglob("*.py"))]


def test_the_table_names_every_package():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    allowed = allowed_imports()
    assert set(allowed) == packages | {"base"}
    assert all(may <= set(allowed) for may in allowed.values())


def test_every_import_goes_a_way_the_architecture_allows():
    allowed = allowed_imports()
    found = [v for module, source, is_package in source_modules() for v in violations(source, module, is_package, allowed)]
    assert not found, "\n".join(found)


def test_no_two_modules_import_each_other():
    modules = source_modules()
    names = {module for module, _, _ in modules}
    graph: dict[str, set[str]] = {}
    for module, source, is_package in modules:
        targets = {name if name in names else name.rsplit(".", 1)[0] for _, name in imported_modules(source, module, is_package)}
        graph[module] = {t for t in targets if t in names and t != module}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        pytest.fail(f"import cycle: {' -> '.join(err.args[1])}")


SPEED_PACKAGES = {"flash_attn", "quack", "cutlass", "nvidia_cutlass_dsl", "triton"}  # accel's alone


def speed_imports(source: str) -> list[tuple[int, str]]:
    """(line, name) of every import of SPEED_PACKAGES in SOURCE, by statement or importlib.import_module("...")."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value:
            found.append((node.lineno, node.value))  # a module named in a string, as import_module takes it
    return [(line, name) for line, name in found if name.split(".")[0] in SPEED_PACKAGES]


def test_only_accel_imports_the_speed_packages():
    found = [f"{module}:{line} imports {name}" for module, source, _ in source_modules()
             if package_of(module) != "accel" for line, name in speed_imports(source)]
    assert not found, "\n".join(found)
    assert speed_imports("import triton\nfrom quack.gemm_interface import gemm\nM = 'flash_attn.cute.interface'\n") == [
        (1, "triton"), (2, "quack.gemm_interface"), (3, "flash_attn.cute.interface")]


@pytest.mark.parametrize("source,module", [
    ("from gptforge.train.config import TrainConfig", "gptforge.core.versions"),
    ("def f():\n    from gptforge.cli import main", "gptforge.compat.rules"),
    ("from gptforge import doctor", "gptforge.probe.nvml"),
    ("from ..cli import main", "gptforge.links.plan"),
    ("import gptforge.compat.rules", "gptforge.errors"),
])
def test_an_import_against_the_table_is_reported(source, module):
    assert violations(source, module, False, allowed_imports())


def test_the_lock_authoring_lives_outside_the_package():
    """The solver over the record store, uv's resolution and the record import are tasks/lockgen/; the
    compatibility tables' builders (PyPI fetches, wheel measuring) are tasks/compatgen/."""
    for module, source, is_package in source_modules():
        imported = [name for _, name in imported_modules(source, module, is_package)]
        assert not any(name.startswith(("lockgen", "compatgen")) for name in imported)
        for writer in ("solve_with_sparse_repodata", "find_uv_bin", "import_locks"):
            assert writer not in source, f"{module} holds {writer}"
    assert (ROOT / "tasks" / "lockgen" / "build.py").is_file()
    assert (ROOT / "tasks" / "compatgen" / "refresh.py").is_file()
    assert not list(SRC.rglob("*refresh*.py"))


def step_files() -> tuple[list[str], list[str]]:
    """docs/architecture.md's files for one step on the plain path: the numbered ones (what the step computes)
    and those of the paragraph "Around the step"."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Reading one training step", 1)[1].split("\n## ", 1)[0]
    numbered = "\n".join(line for line in section.splitlines() if re.match(r"\d+\. ", line))
    around = section.split("Around the step", 1)[1]
    return (sorted(set(re.findall(r"`([\w/]+\.py)`", numbered))),
            sorted(set(re.findall(r"`([\w/]+\.py)`", around)) - {"test_architecture.py"}))


def test_one_training_step_reads_in_ten_files_and_1500_lines():
    """The files docs/architecture.md lists for one step on the plain path stay as few and as short as promised."""
    files, _ = step_files()
    lines = sum(len((SRC / f).read_text(encoding="utf-8").splitlines()) for f in files)
    assert len(files) <= 10 and lines <= 1500, (len(files), lines, files)


def test_one_cpu_step_reaches_only_the_modules_the_docs_name(tmp_path):
    """Traced: every gptforge module a plain CPU step executes, from queueing its micro batches to reading its
    loss, is one docs/architecture.md names for the step or around it."""
    import sys

    from test_train_pipeline import trainer as built_trainer

    trainer = built_trainer(tmp_path, "run")
    reached = set()

    def trace(frame, event, arg):
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(SRC):
            reached.add(path.relative_to(SRC).as_posix())

    sys.settrace(trace)
    try:
        trainer.train_step()
    finally:
        sys.settrace(None)
    computing, around = step_files()
    assert {"model/gpt.py", "train/engine.py", "train/optim.py"} <= reached  # the trace saw the step
    assert reached <= set(computing) | set(around), sorted(reached - set(computing) - set(around))


def test_no_module_is_over_400_lines():
    """A module over 400 lines holds more than one job; split it where the jobs part."""
    long = {p.relative_to(SRC).as_posix(): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert not long, long
