"""`gptforge lock check`'s satisfiability rules against pixi 0.77.0's own fixture workspaces
(tests/data/pixi-0.77.0, see its PROVENANCE): every satisfiable one passes, every non-satisfiable one
fails with the finding of pixi's snapshot (by kind), every one left out says why."""

from pathlib import Path

import pytest

from gptforge.lock import satisfy
from gptforge.lock.workspace import Unsupported

FIXTURES = Path(__file__).parent / "data" / "pixi-0.77.0"

# fixture -> the finding code of pixi's snapshot (crates/pixi_core/src/lock_file/satisfiability/snapshots/)
REJECTED = {
    "changed-env-marker": "unsatisfiable-requirement",
    "changed-platform-subdir": "platform-definition-changed",
    "changed-platform-virtual-package": "platform-definition-changed",
    "conditional-dependency-not-locked": "unsatisfiable-match-spec",
    "explicit-pypi-dependency": "conda-package-should-be-pypi",
    "mismatch-channel-priority": "channel-priority-mismatch",
    "mismatch-channel-priority2": "channel-priority-mismatch",
    "mismatch-exclude-newer": "exclude-newer-mismatch",
    "mismatch-exclude-newer2": "exclude-newer-mismatch",
    "mismatch-pypi-prerelease-mode": "prerelease-mode-mismatch",
    "mismatch-solve-strategy": "solve-strategy-mismatch",
    "mismatch-solve-strategy2": "solve-strategy-mismatch",
    "mismatched-spec": "unsatisfiable-match-spec",
    "missing-dependency": "unsatisfiable-match-spec",
    "missing-pypi-extra": "unsatisfiable-requirement",
    "mixed-pypi-conda": "too-many-conda",
    "non-binary-no-build": "no-build-non-binary",
    "pypi-index-added": "pypi-index-mismatch",
    "pypi-index-mismatch": "pypi-index-mismatch",
    "pypi-index-removed": "pypi-index-mismatch",
    "pypi-missing-version": "pypi-version-mismatch",
    "removed-environment": "environment-removed",
    "solve-groups-pypi": "unsatisfiable-requirement",
    "too-many-platforms": "additional-platforms",
    "wheels-with-wrong-tags": "wheel-tags-mismatch",
}

# fixture -> why the offline check cannot judge it (pixi's own test skips the two without pixi.toml)
OUT_OF_SCOPE = {
    "satisfiability/no-build-editable": "no pixi.toml (a pyproject.toml manifest; pixi's test globs */pixi.toml)",
    "satisfiability/old_lock_file": "no pixi.toml (a pyproject.toml manifest; pixi's test globs */pixi.toml)",
    "satisfiability/out-of-tree-source": "pixi-build source package: needs a source build",
    "satisfiability/out-of-tree-source-parent": "pixi-build source package: needs a source build",
    "satisfiability/source-dependency": "pixi-build source package: needs a source build",
    "satisfiability/pypi-dynamic-version": "a local package with dynamic metadata (setup.py): needs a build",
    "non-satisfiability/binary-spec-source-record": "pixi-build source package: needs a source build",
    "non-satisfiability/mismatched-source-spec": "pixi-build git source package: needs a checkout and a build",
    "non-satisfiability/source-extra-dependency-added": "pixi-build source package: needs a source build",
    "non-satisfiability/source-recursive-dependency": "pixi-build source package: needs a source build",
    "non-satisfiability/source-recursive-dependency-changed-dir": "pixi-build source package: needs a source build",
}


def _fixtures(kind: str) -> list[str]:
    return sorted(d.name for d in (FIXTURES / kind).iterdir() if f"{kind}/{d.name}" not in OUT_OF_SCOPE)


@pytest.mark.parametrize("name", _fixtures("satisfiability"))
def test_pixi_accepts_so_does_the_check(name):
    assert satisfy.check(FIXTURES / "satisfiability" / name / "pixi.toml") == []


@pytest.mark.parametrize("name", _fixtures("non-satisfiability"))
def test_pixi_rejects_so_does_the_check(name):
    problems = satisfy.check(FIXTURES / "non-satisfiability" / name / "pixi.toml")
    assert [p.code for p in problems][:1] == [REJECTED[name]]


def test_every_fixture_is_judged_or_listed_with_a_reason():
    every = {f"{kind}/{d.name}" for kind in ("satisfiability", "non-satisfiability") for d in (FIXTURES / kind).iterdir()}
    judged = {f"satisfiability/{n}" for n in _fixtures("satisfiability")}
    judged |= {f"non-satisfiability/{n}" for n in _fixtures("non-satisfiability")}
    assert judged | set(OUT_OF_SCOPE) == every and not judged & set(OUT_OF_SCOPE)
    assert set(REJECTED) == {n for n in _fixtures("non-satisfiability")}


@pytest.mark.parametrize("where", sorted(k for k in OUT_OF_SCOPE if "no pixi.toml" not in OUT_OF_SCOPE[k]))
def test_out_of_scope_fixtures_are_refused_not_guessed(where):
    with pytest.raises(Unsupported):
        satisfy.check(FIXTURES / where / "pixi.toml")
