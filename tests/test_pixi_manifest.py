"""pixi.toml: valid for the pixi it pins, every spec parses, every environment passes the engine,
and the pins equal src/gptforge/compat/data/environments.toml field by field."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import jsonschema
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from gptforge.build.source import apex_pin
from gptforge.compat.project_envs import environments

rattler = pytest.importorskip("rattler", reason="py-rattler (the test extra) parses conda specs")

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "tests" / "data" / "pixi-manifest-v0.77.0.schema.json"
MANIFEST = tomllib.loads((ROOT / "pixi.toml").read_text(encoding="utf-8"))
ENVIRONMENTS = {env.name: env for env in environments()}


def features(name: str) -> list[dict]:
    spec = MANIFEST["environments"][name]
    return [MANIFEST] + [MANIFEST["feature"][f] for f in spec["features"]]


def merged(name: str, table: str) -> dict:
    out: dict = {}
    for feature in features(name):
        out.update(feature.get(table, {}))
    return out


def platform_cuda(name: str) -> str | None:
    rich = {p["name"]: p for p in MANIFEST["workspace"]["platforms"] if isinstance(p, dict)}
    found = [rich[p]["cuda"] for f in features(name)[1:] for p in f.get("platforms", []) if p in rich]
    assert len(found) <= 1, f"{name}: more than one CUDA platform"
    return found[0] if found else None


def pypi_pin(spec) -> str:
    text = spec if isinstance(spec, str) else spec["version"]
    pins = [s.version for s in SpecifierSet(text) if s.operator == "=="]
    assert len(pins) == 1, f"{text!r} is not one == pin"
    return pins[0]


def conda_release(spec: str) -> str:
    """'12.6.*' or '==2.7.1' -> the version it pins (wildcard dropped)."""
    match = re.fullmatch(r"(?:==)?(\d+(?:\.\d+)*)(?:\.\*)?", spec)
    assert match, f"{spec!r} does not pin one release"
    return match.group(1)


def gcc_range(spec: str) -> tuple[str, str]:
    """'>=11.3,<14' -> ('11.3', '13'): the oldest and the newest gcc major the spec admits."""
    low, high = re.fullmatch(r">=([\d.]+),<(\d+)", spec).groups()
    return low, str(int(high) - 1)


class Declared:
    """One environment as pixi.toml declares it, in environments.toml's terms."""

    def __init__(self, name: str):
        self.conda, self.pypi = merged(name, "dependencies"), merged(name, "pypi-dependencies")
        self.cuda = platform_cuda(name)
        self.python = conda_release(self.conda["python"])
        self.gcc = gcc_range(self.conda["gxx_linux-64"])
        if "torch" in self.pypi:
            self.torch, self.torch_channel = pypi_pin(self.pypi["torch"]), "pypi"
        else:
            self.torch, self.torch_channel = conda_release(self.conda["pytorch-gpu"]), "conda-forge"
        nvcc = self._first(("cuda-nvcc", "cuda-nvcc-impl", "cuda-nvcc-tools"), ("nvidia-cuda-nvcc",))
        self.nvcc = ".".join(nvcc.split(".")[:2]) if nvcc else None  # the CUDA release it belongs to
        self.cudnn = self._first(("cudnn",), ("nvidia-cudnn-cu12", "nvidia-cudnn-cu13"))
        self.nccl = self._first(("nccl",), ("nvidia-nccl-cu12", "nvidia-nccl-cu13"))

    def _first(self, conda_names, pypi_names) -> str | None:
        for n in conda_names:
            if n in self.conda:
                return conda_release(self.conda[n])
        for n in pypi_names:
            if n in self.pypi:
                return pypi_pin(self.pypi[n])
        return None


def test_manifest_validates_against_the_schema_of_the_pixi_it_pins():
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert MANIFEST["workspace"]["requires-pixi"] == ">=0.77.0,<0.78"
    assert "v0.77.0" in schema["$id"]
    jsonschema.validate(MANIFEST, schema)


def test_the_schema_check_rejects_a_misspelt_key():
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    broken = json.loads(json.dumps(MANIFEST))
    broken["feature"]["cuda-13-0"]["pypi-dependancies"] = broken["feature"]["cuda-13-0"].pop("pypi-dependencies")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def _all_specs():
    for where, feature in [("workspace", MANIFEST), *MANIFEST["feature"].items()]:
        for name, spec in feature.get("dependencies", {}).items():
            yield "conda", where, name, spec
        for name, spec in feature.get("pypi-dependencies", {}).items():
            yield "pypi", where, name, spec


@pytest.mark.parametrize("kind,where,name,spec", list(_all_specs()), ids=lambda v: v if isinstance(v, str) else None)
def test_every_spec_parses(kind, where, name, spec):
    if kind == "conda":
        parsed = rattler.MatchSpec(f"{name} {spec}")
        assert parsed.name.normalized == name
    elif isinstance(spec, dict) and "path" in spec:
        assert (ROOT / spec["path"] / "pyproject.toml").exists()
    else:
        text = spec if isinstance(spec, str) else spec["version"]
        Requirement(f"{name}{'' if text == '*' else text}")


def test_every_environment_is_in_environments_toml_and_back():
    named = {n: spec for n, spec in MANIFEST["environments"].items() if n != "default"}
    assert set(named) == set(ENVIRONMENTS)
    for name, spec in named.items():
        assert spec["solve-group"] == name, "each environment solves on its own"


def test_the_default_environment_is_the_cuda_13_line_solved_with_it():
    default, line = MANIFEST["environments"]["default"], MANIFEST["environments"]["cuda-13-0"]
    assert default == line


@pytest.mark.parametrize("name", sorted(ENVIRONMENTS))
def test_manifest_pins_equal_environments_toml(name):
    declared, table = Declared(name), ENVIRONMENTS[name]
    assert declared.cuda == table.cuda
    assert declared.nvcc == table.cuda, "nvcc must be torch's CUDA major.minor"
    assert declared.python == table.python
    assert declared.torch == table.torch
    assert declared.torch_channel == table.torch_channel
    assert declared.gcc == table.gcc
    for field in ("cudnn", "nccl"):
        pinned, fact = getattr(declared, field), getattr(table, field)
        assert (pinned is None) == (fact is None), field
        if pinned:
            assert fact == pinned or fact.startswith(pinned + "."), f"{field}: {pinned} vs {fact}"


def compat_args(name: str, gcc: str) -> list[str]:
    """`gptforge compat check` arguments read from the manifest alone."""
    d = Declared(name)
    args = ["compat", "check", "--python", d.python, "--gcc", gcc]
    if d.cuda is None:
        return args + ["--torch", f"{d.torch}+cpu"]
    # `setup` builds apex in every CUDA environment: its nvcc rule applies
    args += ["--torch", d.torch, "--torch-cuda", d.cuda, "--cuda", d.nvcc, "--apex", apex_pin()["commit"]]
    return args + (["--cudnn", d.cudnn] if d.cudnn else [])


@pytest.mark.parametrize("end", [0, 1], ids=["oldest-gcc", "newest-gcc"])
@pytest.mark.parametrize("name", sorted(ENVIRONMENTS))
def test_every_environment_passes_compat_check_as_declared(cli, name, end):
    args = compat_args(name, Declared(name).gcc[end])
    result = cli(*args, "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], (args, report)
    assert not [f for f in report["findings"] if f["severity"] == "warning"], (args, report["findings"])


def test_compat_check_catches_a_manifest_whose_nvcc_differs_from_torch(cli):
    args = compat_args("cuda-12-6", "13")
    args[args.index("--cuda") + 1] = "12.9"
    report = json.loads(cli(*args, "--json").stdout)
    assert not report["ok"]
    assert "apex-nvcc-mismatch" in {f["code"] for f in report["findings"]}


def test_version_helpers_read_specs_as_pixi_does():
    assert conda_release("12.6.*") == "12.6" and conda_release("==2.7.1") == "2.7.1"
    assert gcc_range(">=11.3,<16") == ("11.3", "15")
    assert pypi_pin({"version": "==2.13.0", "index": "x"}) == "2.13.0"
    assert Version(pypi_pin("==13.0.88")).release[:2] == (13, 0)
