"""The GitHub workflow: valid by GitHub's schema, pinned to the pixi pixi.toml requires, and a matrix
over exactly the manifest's environments, each CUDA one installing on CPU runners by override."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
MANIFEST = tomllib.loads((ROOT / "pixi.toml").read_text(encoding="utf-8"))
CI = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8"))


def check_jsonschema() -> str:
    found = Path(sys.executable).parent / "check-jsonschema"
    if found.exists():
        return str(found)
    path = shutil.which("check-jsonschema")
    if path is None:
        pytest.fail("check-jsonschema is not installed: pip install -e '.[test]'")
    return path


def validate(paths) -> subprocess.CompletedProcess:
    return subprocess.run([check_jsonschema(), "--builtin-schema", "vendor.github-workflows", *map(str, paths)],
                          capture_output=True, text=True)


def test_workflows_validate_against_githubs_schema():
    assert WORKFLOWS
    result = validate(WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_catches_a_broken_workflow(tmp_path):
    broken = dict(CI)
    broken["jobs"] = {"lock": {**CI["jobs"]["lock"], "runs-on": None, "step": []}}
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump(broken), encoding="utf-8")
    assert validate([path]).returncode != 0


def setup_pixi_steps():
    for job in CI["jobs"].values():
        for step in job["steps"]:
            if step.get("uses", "").startswith("prefix-dev/setup-pixi@"):
                yield step


def test_every_job_installs_the_pixi_the_manifest_requires_from_the_lock():
    required = MANIFEST["workspace"]["requires-pixi"]
    lowest = required.split(",")[0].removeprefix(">=")
    steps = list(setup_pixi_steps())
    assert len(steps) == len(CI["jobs"])
    for step in steps:
        assert step["with"]["pixi-version"] == f"v{lowest}"
        assert step["with"]["locked"] is True


def test_the_matrix_covers_every_environment_with_its_cuda_override():
    rich = {p["name"]: p["cuda"] for p in MANIFEST["workspace"]["platforms"] if isinstance(p, dict)}
    expected = {}
    for name, env in MANIFEST["environments"].items():
        if name == "default":  # the cuda-13-0 features again; its job would repeat cuda-13-0's
            continue
        platforms = [p for f in env["features"] for p in MANIFEST["feature"][f].get("platforms", [])]
        expected[name] = next((rich[p] for p in platforms if p in rich), "")
    matrix = {row["environment"]: row["cuda"] for row in CI["jobs"]["environments"]["strategy"]["matrix"]["include"]}
    assert matrix == expected
    assert CI["jobs"]["environments"]["env"]["CONDA_OVERRIDE_CUDA"] == "${{ matrix.cuda }}"


def test_gpu_tests_run_on_a_self_hosted_gpu_runner():
    gpu = CI["jobs"]["gpu"]
    assert "self-hosted" in gpu["runs-on"] and "gpu" in gpu["runs-on"]
    assert any("test -m gpu" in step.get("run", "") for step in gpu["steps"])


def evaluate(expression: str, context: dict) -> bool:
    """A job's `if:` made of `A == B` terms joined by `||` (the only form this workflow uses)."""
    def value(term: str):
        term = term.strip()
        if term.startswith("'") and term.endswith("'"):
            return term[1:-1]
        node = context
        for key in term.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        return node

    results = []
    for clause in expression.split("||"):
        left, right = clause.split("==")
        results.append(value(left) == value(right))
    return any(results)


def pull_request(head_repo: str) -> dict:
    return {"github": {"event_name": "pull_request", "repository": "owner/gptforge",
                       "event": {"pull_request": {"head": {"repo": {"full_name": head_repo}}}}}}


def test_the_self_hosted_gpu_job_never_runs_a_forks_pull_request():
    condition = CI["jobs"]["gpu"]["if"]
    assert evaluate(condition, {"github": {"event_name": "push", "repository": "owner/gptforge"}})
    assert evaluate(condition, pull_request("owner/gptforge"))
    assert not evaluate(condition, pull_request("someone/gptforge"))
    triggers = CI[True]  # YAML reads the key `on` as true
    assert "pull_request_target" not in triggers and "workflow_run" not in triggers


def test_every_push_runs_the_lock_check_offline():
    triggers = CI[True]
    assert "push" in triggers and not (triggers["push"] or {}).get("branches")
    lock = CI["jobs"]["lock"]
    assert "if" not in lock
    assert "pixi run -e cpu gptforge lock check" in [step.get("run") for step in lock["steps"]]


def test_only_the_cpu_environment_is_cached_and_only_main_writes_it():
    job = CI["jobs"]["environments"]
    step = next(s for s in job["steps"] if s.get("uses", "").startswith("prefix-dev/setup-pixi@"))
    assert step["with"]["cache"] == "${{ matrix.environment == 'cpu' }}"
    assert step["with"]["cache-write"] == "${{ github.event_name == 'push' && github.ref == 'refs/heads/main' }}"
    text = (ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8")
    comment = " ".join(line.lstrip("# ") for line in text.split("\nname: ci")[0].splitlines())
    for row in job["strategy"]["matrix"]["include"]:   # the comment gives each environment's size
        assert re.search(rf"\b{row['environment']} [\d.]+ GB", comment), row


def test_the_cpu_job_installs_what_the_interop_tests_read_as_ci_does():
    """The Megatron, Triton-interpreter and Nix tests run in the workflow too: the cpu job installs what
    .ci/run installs (one script for both) before its tests, and points MEGATRON_LM_SRC at it."""
    steps = CI["jobs"]["environments"]["steps"]
    names = [s.get("name", "") for s in steps]
    extras = next(s for s in steps if ".ci/test-extras.sh" in s.get("run", ""))
    assert extras["if"] == "matrix.environment == 'cpu'"
    assert steps.index(extras) < names.index("tests")
    assert "MEGATRON_LM_SRC=$PWD/.ci/megatron-core" in extras["run"] and "nix-bin" in extras["run"]
    assert "bash .ci/test-extras.sh .venv/bin/pip" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
