"""A test that skips cannot fail. The default suite may skip for what a machine lacks (a GPU, a CUDA toolkit,
what root cannot be stopped from doing) or for what .ci/run installs beside the package, and says which; it
never skips for a Python package that the project's locked test environment does not install."""

from __future__ import annotations

import ast
import importlib.metadata
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the environment CI and README's test command install: the cpu environment's hashed export
EXPORT = ROOT / "envs" / "cpu" / "requirements.txt"


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_distributions() -> set[str]:
    return {normalized(m[1]) for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", EXPORT.read_text(), re.MULTILINE)}


def gpu_only(function: ast.FunctionDef | None) -> bool:
    return function is not None and any("gpu" in ast.unparse(d) for d in function.decorator_list)


def importorskips() -> list[tuple[str, str]]:
    """(where, module) of each pytest.importorskip("module") outside a GPU-marked test."""
    found = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        tree = ast.parse(path.read_text())
        owner = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                for inner in ast.walk(node):
                    owner.setdefault(inner, node)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "importorskip"
                    and node.args and isinstance(node.args[0], ast.Constant) and not gpu_only(owner.get(node))):
                found.append((f"{path.name}:{node.lineno}", node.args[0].value))
    return found


def test_every_importorskip_names_a_package_the_locked_test_environment_installs():
    providers = importlib.metadata.packages_distributions()
    locked = locked_distributions()
    calls = importorskips()
    assert calls  # the scan finds them (pyarrow, tiktoken, uv, rattler, ...)
    unlocked = [(where, module) for where, module in calls
                if not {normalized(d) for d in providers.get(module.split(".")[0], [])} & locked]
    assert unlocked == [], f"skips for packages {EXPORT.relative_to(ROOT)} does not install: {unlocked}"


def import_time_skips() -> list[str]:
    """Where a test module skips itself while it is imported (pytest.skip(..., allow_module_level=True))."""
    found = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "skip"
                    and any(k.arg == "allow_module_level" for k in node.keywords)):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_module_skips_at_import():
    """A module skipped at import is listed among the default run's skips even where its marker deselects it (a GPU
    module on a CPU machine): a skipif mark lets `-m 'not gpu'` deselect it instead."""
    assert import_time_skips() == []
