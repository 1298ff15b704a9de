"""fix-links on the layouts users have besides conda-forge's: libraries named by their SONAME only
(NVIDIA's PyPI wheels, this kind of toolkit), a plain toolkit copy, and the CUDA_HOME of a prefix
whatever its layout (``--print-cuda-home``)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import run_cli, symlink, toolkit_cudart, toolkit_dir, versioned_library, write
from gptforge import links
from gptforge.links.families import families_for


def _fix(prefix, *args):
    return run_cli("fix-links", "--prefix", str(prefix), *args)


def _soname_only_runtime(prefix) -> tuple[str, int]:
    """The toolkit's real libcudart in prefix/lib under its SONAME only, as NVIDIA's wheels ship it."""
    real, number = toolkit_cudart()
    name = f"libcudart.so.{number // 1000}"
    os.makedirs(os.path.join(prefix, "lib"), exist_ok=True)
    shutil.copyfile(real, os.path.join(prefix, "lib", name))
    return name, number


@pytest.mark.parametrize("with_flag", [True, False])
def test_runtime_named_by_soname_only(tmp_path, with_flag):
    name, number = _soname_only_runtime(tmp_path)
    cuda = f"{number // 1000}.{number % 1000 // 10}"
    out = _fix(tmp_path, "--json", *(["--cuda", cuda] if with_flag else []))
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["cuda"] == cuda
    assert report["cuda_source"] == ("--cuda" if with_flag else f"cudaRuntimeGetVersion of lib/{name}")
    assert report["chosen"]["libcudart"] == {"file": f"lib/{name}", "version": cuda, "soname": name}
    assert {v["path"]: v["runtime_version"] for v in report["verified"]} == {
        "lib/libcudart.so": number, f"lib/{name}": number}
    assert os.readlink(tmp_path / "lib" / "libcudart.so") == name


def test_hint_never_names_a_flag_already_given(tmp_path):
    _, number = _soname_only_runtime(tmp_path)
    other = f"{number // 1000 - 1}.8"  # a release the prefix does not hold
    given_flag = _fix(tmp_path, "--cuda", other, "--dry-run", "--json")
    assert given_flag.returncode == 1
    finding = next(f for f in json.loads(given_flag.stdout)["findings"] if f["code"] == "links-no-match")
    assert "pass --cuda" not in finding["fix"] and f"--cuda {other} is the environment's" in finding["fix"]
    write(str(tmp_path / "conda-meta" / f"cuda-version-{other}-0.json"), json.dumps({"version": other}).encode())
    from_record = json.loads(_fix(tmp_path, "--dry-run", "--json").stdout)
    finding = next(f for f in from_record["findings"] if f["code"] == "links-no-match")
    assert "pass --cuda X.Y" in finding["fix"]


_PROBED = {f.stem: f for f in families_for((13, 0)) if f.probe}


def test_every_family_with_a_rule_on_minors_declares_how_to_read_its_version():
    """SONAME-only names carry the major alone: every family whose rule needs more must be readable."""
    for family in families_for((13, 0)):
        assert (family.detail > 1) == (family.probe is not None), family.stem


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stem=st.sampled_from(sorted(_PROBED)), major=st.sampled_from([12, 13]), minor=st.integers(0, 9),
       patch=st.integers(0, 4), cuda=st.sampled_from([(12, 8), (12, 9), (13, 0), (13, 1)]))
def test_soname_only_version_is_read_from_the_file(tmp_path_factory, stem, major, minor, patch, cuda):
    family = next(f for f in families_for(cuda) if f.stem == stem)
    prefix = tmp_path_factory.mktemp("env")
    soname = f"{stem}.so.{major}"
    built = versioned_library(soname, *family.probe, (major, minor, patch))
    os.makedirs(prefix / "lib")
    shutil.copyfile(built, prefix / "lib" / soname)

    result = links.fix(str(prefix), cuda, source="--cuda", dry_run=True)
    read = (major, minor) if family.probe[1] != "property" else (major, minor, patch)
    verdict = family.matches(read, cuda)
    codes = {f.code for f in result.findings}
    if verdict is None:
        assert "links-rule-unknown" in codes and stem not in result.chosen
    elif verdict:
        assert result.chosen[stem].version == read and result.chosen[stem].soname == soname
        assert {s.path for s in result.steps} >= {str(prefix / "lib" / f"{stem}.so")}
    else:
        assert "links-no-match" in codes and stem not in result.chosen


def test_file_whose_version_major_disagrees_with_its_soname_is_ignored(tmp_path):
    built = versioned_library("libnvrtc.so.13", "nvrtcVersion", "major-minor", (12, 9, 0))
    os.makedirs(tmp_path / "lib")
    shutil.copyfile(built, tmp_path / "lib" / "libnvrtc.so.13")
    result = links.fix(str(tmp_path), (13, 0), dry_run=True)
    ignored = [f.message for f in result.findings if f.code == "links-candidate-ignored"]
    assert ignored and "nvrtcVersion says 12.9" in ignored[0] and "libnvrtc" not in result.chosen


def test_cudnn_needs_only_the_soname_major(tmp_path):
    """cuDNN's rule (newest per major) needs only what the SONAME says; nothing is loaded for it."""
    built = versioned_library("libcudnn_ops.so.9", "unused", "runtime", (9, 0, 0))
    os.makedirs(tmp_path / "lib")
    shutil.copyfile(built, tmp_path / "lib" / "libcudnn_ops.so.9")
    result = links.fix(str(tmp_path), (13, 0), dry_run=True)
    assert result.chosen["libcudnn_ops"].version == (9,)
    assert [s.target for s in result.steps if s.path.endswith("libcudnn_ops.so")] == ["libcudnn_ops.so.9"]


# --- a plain toolkit copy: which CUDA is it --------------------------------------------------------


def _nvcc_or_skip() -> str:
    nvcc = os.path.join(toolkit_dir(), "bin", "nvcc")
    if not os.access(nvcc, os.X_OK):
        pytest.skip(f"no nvcc under {toolkit_dir()}/bin")
    return nvcc


def test_plain_toolkit_copy_says_which_cuda_from_nvcc(tmp_path):
    _, number = _soname_only_runtime(tmp_path)
    (tmp_path / "bin").mkdir()
    _place(_nvcc_or_skip(), str(tmp_path / "bin" / "nvcc"))
    shutil.copyfile(os.path.join(toolkit_dir(), "bin", "nvcc.profile"), tmp_path / "bin" / "nvcc.profile")
    out = _fix(tmp_path, "--dry-run")
    assert out.returncode == 0, out.stdout + out.stderr
    cuda = f"{number // 1000}.{number % 1000 // 10}"
    assert f"CUDA {cuda} (from bin/nvcc --version: release {cuda})" in out.stdout.splitlines()[0]


def test_plain_toolkit_copy_says_which_cuda_from_version_json(tmp_path):
    _, number = _soname_only_runtime(tmp_path)
    cuda = f"{number // 1000}.{number % 1000 // 10}"
    write(str(tmp_path / "version.json"), json.dumps({"cuda": {"name": "CUDA SDK", "version": f"{cuda}.2"}}).encode())
    out = _fix(tmp_path, "--dry-run")
    assert out.returncode == 0 and f"CUDA {cuda} (from version.json)" in out.stdout, out.stdout + out.stderr


def test_nothing_tells_the_cuda_release_is_still_one_usage_line(tmp_path):
    write(str(tmp_path / "lib" / "libcudart.so.13"), b"not a library\n")
    dry = _fix(tmp_path, "--dry-run", "--json")  # a dry run asks no python of the prefix, torch included
    assert dry.returncode == 2 and dry.stderr.count("\n") == 1
    assert "a dry run does not run the environment's python" in dry.stderr
    out = _fix(tmp_path, "--json")
    if out.returncode == 0:  # a CUDA build of torch answered
        assert json.loads(out.stdout)["cuda_source"].startswith("torch.version.cuda")
        return
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "version.json, no bin/nvcc" in out.stderr


# --- the header plan, grouped ----------------------------------------------------------------------


def test_header_plan_is_counted_by_default_and_listed_with_verbose(tmp_path):
    for i in range(40):
        write(str(tmp_path / "targets/x86_64-linux/include" / f"h{i:02}.h"), b"/* cuda */\n")
    (tmp_path / "include").mkdir(parents=True)
    symlink("nowhere.h", str(tmp_path / "include" / "h00.h"))  # a dangling one among them
    write(str(tmp_path / "include" / "h01.h"), b"/* another package's */\n")
    (tmp_path / "lib").mkdir()
    short = _fix(tmp_path, "--cuda", "13.0", "--dry-run")
    assert short.returncode == 0, short.stdout + short.stderr
    assert "  header: 39 links in include (was: 38 absent, 1 dangling link; --verbose lists them)" in short.stdout
    assert len(short.stdout.splitlines()) < 8
    full = _fix(tmp_path, "--cuda", "13.0", "--dry-run", "--verbose").stdout
    assert sum(line.startswith("  link include/h") for line in full.splitlines()) == 39
    steps = json.loads(_fix(tmp_path, "--cuda", "13.0", "--dry-run", "--json").stdout)["steps"]
    assert sorted(s["kind"] for s in steps) == ["header"] * 39 + ["lib64"]


# --- CUDA_HOME of a prefix, whatever its layout ----------------------------------------------------


def _place(src: str, dst: str) -> None:
    """A hard link where the file system allows it (the toolkit is large), else a copy; fix-links
    never writes to regular files, so the toolkit's files stay as they are."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def test_print_cuda_home_on_the_three_layouts(tmp_path):
    conda = tmp_path / "conda"
    write(str(conda / "targets/x86_64-linux/include/cuda_runtime.h"), b"/* */\n")
    (conda / "lib").mkdir()
    (conda / "conda-meta").mkdir()
    venv = tmp_path / "venv"
    wheel_root = venv / "lib/python3.11/site-packages/nvidia/cu13"
    write(str(wheel_root / "include/cuda_runtime.h"), b"/* */\n")
    write(str(venv / "lib/python3.11/site-packages/nvidia/cu12/include/cuda_runtime.h"), b"/* */\n")
    write(str(wheel_root / "bin/nvcc"), b"")
    (wheel_root / "lib").mkdir()
    toolkit = tmp_path / "toolkit"
    write(str(toolkit / "include/cuda_runtime.h"), b"/* */\n")
    (toolkit / "lib").mkdir()
    for prefix, home, layout in ((conda, conda, "conda"), (venv, wheel_root, "wheels"), (toolkit, toolkit, "toolkit"),
                                 (wheel_root, wheel_root, "toolkit")):
        out = _fix(prefix, "--print-cuda-home")
        assert (out.returncode, out.stdout) == (0, f"{home}\n"), out.stderr
        shown = json.loads(_fix(prefix, "--print-cuda-home", "--json").stdout)
        assert shown == {"cuda_home": str(home), "layout": layout}
    out = run_cli("fix-links", "--print-cuda-home", env={"CONDA_PREFIX": str(venv)})
    assert out.stdout == f"{wheel_root}\n"


def test_print_cuda_home_without_cuda_is_one_line(tmp_path):
    (tmp_path / "lib").mkdir()
    out = _fix(tmp_path, "--print-cuda-home")
    assert out.returncode == 1 and out.stdout == "" and out.stderr.count("\n") == 1
    assert "no CUDA toolkit in" in out.stderr
    bad = _fix(tmp_path, "--print-cuda-home", "--undo")
    assert bad.returncode == 2 and "does not go with --undo" in bad.stderr
