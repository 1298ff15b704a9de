"""pixi.lock and envs/: parsed by rattler and conda-lock, rebuilt offline byte for byte, checked, and
each mutation caught by `gptforge lock check` with a precise line."""

from __future__ import annotations

import json
import re
import shutil
import tomllib
import zipfile
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from packaging.utils import canonicalize_name

from conftest import run_main
from gptforge.errors import GptforgeError
from gptforge.lock import check, manifest, store
from gptforge.lock.pypi import pyproject_requires_dist

from lockgen import pypi, writer
from lockgen.build import build, registry_pins

ROOT = Path(__file__).resolve().parents[1]


def _check(root: Path) -> list[check.Problem]:
    m = manifest.load(root / "pixi.toml")
    return check.check(m, store.Store(m.root / "envs" / "records"))


def test_every_environment_is_locked_for_its_platform():
    from rattler import LockFile

    m = manifest.load(ROOT / "pixi.toml")
    lock = LockFile.from_path(ROOT / "pixi.lock")
    names = writer.lock_platform_names(m)
    for env in m.environments.values():
        locked = lock.environment(env.name)
        assert locked is not None, env.name
        assert [p.name for p in locked.platforms()] == [names[env.platform.name]]
    del lock, locked


def test_offline_rebuild_gives_the_committed_bytes(workspace):
    """The writer, not the copy, gives the committed bytes: the workspace's lock loses every record's
    `purls` and torch's `index:` (what pixi reads and the writer must add) and the exports are blanked."""
    lock = workspace / "pixi.lock"
    stripped = re.sub(r"^  (purls:.*\n(?:  - .*\n)*|index: .*\n)", "", lock.read_text(), flags=re.M)
    assert "purls:" not in stripped and "\n  index: " not in stripped
    lock.write_text(stripped)
    exports = [p for p in (workspace / "envs").glob("*/*.*") if p.parent.name != "records"]
    for path in exports:
        path.write_text("")
    assert exports
    m = manifest.load(workspace / "pixi.toml")
    build(m, store.Store(workspace / "envs" / "records"))
    for path in [workspace / "pixi.lock", *sorted((workspace / "envs").glob("*/*.*"))]:
        rel = path.relative_to(workspace)
        assert path.read_bytes() == (ROOT / rel).read_bytes(), rel


def test_lock_check_passes():
    assert [p.line() for p in _check(ROOT)] == []


def test_the_command_passes_the_lock_and_names_where_a_mutation_fails(workspace):
    """What CI runs: exit 0 on the project's lock; a finding names its environment, platform and code."""
    done = run_main("lock", "check", "--json", "--manifest", str(workspace / "pixi.toml"))
    assert (done.returncode, json.loads(done.stdout)) == (0, {"ok": True, "problems": []}), done.stderr
    _mutate_drop_torch_index(workspace)
    done = run_main("lock", "check", "--json", "--manifest", str(workspace / "pixi.toml"))
    found = [(p["environment"], p["platform"], p["code"]) for p in json.loads(done.stdout)["problems"]]
    assert (done.returncode, found) == (1, [("cpu", "linux-64", "pypi-index-mismatch")])


def test_the_exports_are_the_same_text_with_either_yaml_emitter(monkeypatch):
    """The check renders through libyaml's emitter; a machine whose PyYAML lacks it uses the Python one."""
    import yaml

    from gptforge.lock import exports
    from gptforge.lock.files import read_yaml

    m, lock = manifest.load(ROOT / "pixi.toml"), read_yaml(ROOT / "pixi.lock")
    with_libyaml = exports.render_all(m, lock)
    monkeypatch.delattr(yaml, "CSafeDumper")
    assert exports.render_all(m, lock) == with_libyaml


def test_conda_lock_parses_every_export():
    from conda_lock.lockfile import parse_conda_lock_file

    m = manifest.load(ROOT / "pixi.toml")
    paths = sorted(ROOT.glob("envs/*/conda-lock.yml"))
    # `default` repeats cuda-13-0 (same features and solve-group): locked, but not exported twice
    assert m.environments["default"].composition == m.environments["cuda-13-0"].composition
    assert {p.parent.name for p in paths} == set(m.environments) - {"default"}
    for path in paths:
        parsed = parse_conda_lock_file(path)
        assert parsed.package and all(p.hash.sha256 for p in parsed.package)


def _test_extra(root: Path, startswith: str) -> tuple[str, str]:
    """pyproject's version and the `test` extra's requirement that starts with `startswith`."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    return project["version"], next(r for r in project["optional-dependencies"]["test"] if r.startswith(startswith))


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))


def _mutate_pin(root):
    _replace(root / "pixi.toml", 'nccl = "2.28.*"', 'nccl = "2.27.*"')
    return "unsatisfiable-match-spec"


def _mutate_missing_dependency(root):
    lock = root / "pixi.lock"
    line = next(l for l in lock.read_text().splitlines() if "/linux-64/libzlib-" in l and l.startswith("      - conda:"))
    _replace(lock, line + "\n", "")
    return "unsatisfiable-match-spec"


def _mutate_pypi_hash(root):
    lock = root / "pixi.lock"
    sha = re.search(r"- pypi: https://files\.pythonhosted\.org/\S+numpy\S+\n(?:  .*\n)*?  sha256: (\w+)", lock.read_text()).group(1)
    _replace(lock, sha, "0" * 64)
    return "export-stale"


def _mutate_other_cuda_build(root):
    lock = root / "pixi.lock"
    text = lock.read_text()
    here = re.search(r"conda-forge/linux-64/(pytorch-2\.7\.1-cuda129_\S+\.conda)", text).group(1)
    records = (root / "envs/records/records.tsv").read_text()
    other = re.search(r"\t(pytorch-2\.7\.1-cuda126_\S+\.conda)\t", records).group(1)
    lock.write_text(text.replace(here, other))
    return "cuda-build"


def _mutate_nvcc(root):
    lock = root / "pixi.lock"
    text = lock.read_text()
    here = re.search(r"linux-64/(cuda-nvcc-tools-12\.6\S+\.conda)", text).group(1)
    other = re.search(r"\t(cuda-nvcc-tools-12\.9\S+\.conda)\t", (root / "envs/records/records.tsv").read_text()).group(1)
    lock.write_text(text.replace(here, other))
    return "nvcc-torch-mismatch"


def _mutate_drop_extra_package(root):
    lock = root / "pixi.lock"
    ref = re.search(r"\n      - pypi: \S+/pytest-[^/\s]+\.whl", lock.read_text()).group(0)
    _replace(lock, ref, "")
    return "unsatisfiable-requirement"


def _mutate_extra_in_pyproject(root):
    _, pytest_req = _test_extra(root, "pytest")
    _replace(root / "pyproject.toml", f'"{pytest_req}"', f'"{pytest_req}", "numpy>=1.26.1"')
    return "local-metadata-mismatch"


def _mutate_unknown_extra(root):
    _replace(root / "pixi.toml", 'extras = ["test"]', 'extras = ["tests"]')
    return "unknown-extra"


def _mutate_duplicate_export(root):
    shutil.copytree(root / "envs" / "cuda-13-0", root / "envs" / "default")
    return "export-extra"


def _mutate_drop_purls(root):
    """Without purls, pixi takes conda-forge's tzdata for PyPI's tzdata (package_identifier.rs)."""
    lock = root / "pixi.lock"
    text = lock.read_text()
    start = text.index("\n- conda: https://conda.anaconda.org/conda-forge/noarch/tzdata-") + 1
    end = text.index("\n- ", start + 1)
    lock.write_text(text[:start] + text[start:end].replace("  purls: []\n", "") + text[end:])
    return "too-many-pypi"


def _mutate_drop_torch_index(root):
    _replace(root / "pixi.lock", "  index: https://download.pytorch.org/whl/cpu\n", "")
    return "pypi-index-mismatch"


def _mutate_virtual_package(root):
    """p2 no longer matches linux-64-cuda-12-9 (platform_rename.rs), so cuda-12-9 has nothing locked for
    that platform; pixi's first rule to say so is platform.rs's MissingPurls."""
    _replace(root / "pixi.lock", "  - __cuda=12.9\n", "  - __cuda=12.8\n")
    return "missing-purls"


def _mutate_named_platform(root):
    """Named after the manifest's platform, the lock's differing virtual package is named as such."""
    _replace(root / "pixi.lock", "- name: p2\n", "- name: linux-64-cuda-12-9\n")
    _replace(root / "pixi.lock", "      p2:\n", "      linux-64-cuda-12-9:\n")
    _replace(root / "pixi.lock", "  - __cuda=12.9\n", "  - __cuda=12.8\n")
    return "platform-definition-changed"


def _mutate_stray_pypi_package(root):
    """cpu's list gains a wheel of another environment that nothing in cpu requires."""
    lock = root / "pixi.lock"
    text = lock.read_text()
    stray = re.search(r"      - pypi: \S+/nvidia_cuda_nvcc-\S+\.whl\n", text).group(0)
    at = text.index("      - pypi:", text.index("  cpu:\n"))
    lock.write_text(text[:at] + stray + text[at:])
    return "too-many-pypi"


def _mutate_wheel_tags(root):
    lock = root / "pixi.lock"
    text = lock.read_text()
    wheel = re.search(r"https://\S+/(numpy-\S+-manylinux\S+x86_64\.whl)", text).group(1)
    lock.write_text(text.replace(wheel, wheel.replace("x86_64", "aarch64")))
    return "wheel-tags-mismatch"


# the changed extra's check is also the first step of test_a_changed_extra_fails_the_check_until_relocked
MUTATIONS = [_mutate_pin, _mutate_missing_dependency, _mutate_pypi_hash, _mutate_other_cuda_build, _mutate_nvcc,
             _mutate_drop_extra_package, pytest.param(_mutate_extra_in_pyproject, marks=pytest.mark.slow),
             _mutate_unknown_extra, _mutate_duplicate_export,
             _mutate_drop_purls, _mutate_drop_torch_index, _mutate_virtual_package, _mutate_named_platform, _mutate_stray_pypi_package,
             _mutate_wheel_tags]


@pytest.mark.parametrize("mutate", MUTATIONS)
def test_lock_check_catches_a_mutation(workspace, mutate):
    expected = mutate(workspace)
    codes = [p.code for p in _check(workspace)]
    assert expected in codes, codes


def test_a_changed_extra_fails_the_check_until_relocked(workspace):
    expected = _mutate_extra_in_pyproject(workspace)
    assert expected in [p.code for p in _check(workspace)]
    m = manifest.load(workspace / "pixi.toml")
    build(m, store.Store(workspace / "envs" / "records"))  # the locked numpy satisfies the new entry
    assert "numpy>=1.26.1 ; extra == 'test'" in (workspace / "pixi.lock").read_text()
    assert [p.line() for p in _check(workspace)] == []


def test_relocking_offline_refuses_an_extra_the_lock_cannot_satisfy(workspace):
    _, pytest_req = _test_extra(workspace, "pytest")
    _replace(workspace / "pyproject.toml", f'"{pytest_req}"', f'"{pytest_req}", "pendulum>=3"')
    m = manifest.load(workspace / "pixi.toml")
    with pytest.raises(GptforgeError, match=r"misses 'pendulum>=3 ; extra == 'test'' \(required by gptforge\): not locked"):
        build(m, store.Store(workspace / "envs" / "records"))
    assert (workspace / "pixi.lock").read_bytes() == (ROOT / "pixi.lock").read_bytes()


EXTRA = st.from_regex(r"[a-z][a-z0-9_.-]{0,8}[a-z0-9]", fullmatch=True)


@given(extra=EXTRA, other=EXTRA, marker=st.sampled_from(["", "python_version >= '3.0'", "python_version < '3.0'",
                                                         "sys_platform == 'linux' or os_name == 'nt'"]))
def test_an_optional_dependency_applies_exactly_when_its_extra_is_asked_for(extra, other, marker):
    assume(canonicalize_name(other) != canonicalize_name(extra))
    entry = pyproject_requires_dist({"optional-dependencies": {extra: [f"pytest>=8 ; {marker}" if marker else "pytest>=8"]}})
    markers = pypi.environment_markers("3.11.7")
    assert len(entry) == 1
    assert pypi.applies(entry[0], markers, {extra}) == (marker != "python_version < '3.0'")
    assert pypi.applies(entry[0], markers, {extra.upper()}) == (marker != "python_version < '3.0'")
    assert not pypi.applies(entry[0], markers, {other})
    assert not pypi.applies(entry[0], markers)


def _wheel(directory: Path, name: str, version: str) -> None:
    """A pure-Python wheel holding only its metadata: enough for uv to resolve against."""
    info = f"{name}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)


def test_a_refresh_keeps_the_locked_versions_where_the_requirements_allow(tmp_path, monkeypatch):
    pytest.importorskip("uv", reason="uv resolves the PyPI part (the test extra brings it)")
    for version in ("1.0", "2.0"):
        _wheel(tmp_path, "gfdemo", version)
    monkeypatch.setenv("UV_NO_INDEX", "1")  # uv's own settings: these two wheels are the whole index
    monkeypatch.setenv("UV_FIND_LINKS", str(tmp_path))
    assert pypi.uv_compile(["gfdemo"], [], "3.11.7") == {"gfdemo": "2.0"}  # --upgrade-pypi: the newest
    assert pypi.uv_compile(["gfdemo"], [], "3.11.7", ["gfdemo==1.0"]) == {"gfdemo": "1.0"}  # --refresh-pypi
    assert pypi.uv_compile(["gfdemo>1.5"], [], "3.11.7", ["gfdemo==1.0"]) == {"gfdemo": "2.0"}  # where it fits


def test_the_preferences_are_the_packages_an_index_served():
    packages = [pypi.PypiPackage("gptforge", "0.1.0", "./", None, (), None),
                pypi.PypiPackage("numpy", "2.3.5", "https://files.pythonhosted.org/packages/numpy-2.3.5.whl", "ab", (), None)]
    assert registry_pins(packages) == ["numpy==2.3.5"]
    assert registry_pins(None) == []
