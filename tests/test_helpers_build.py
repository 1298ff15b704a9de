"""`gptforge build helpers`: a real g++/pybind11 compile for this interpreter, cached, built once;
the compiled functions equal the NumPy reference on generated inputs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import json
import shutil
import sysconfig

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples, run_cli
from gptforge.data import sample_index as si

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    cache = tmp_path_factory.mktemp("gptforge-cache")
    env = {"GPTFORGE_CACHE": str(cache)}
    first = run_cli("build", "helpers", "--json", env=env)
    second = run_cli("build", "helpers", "--json", env=env)
    return cache, first, second


@pytest.fixture(scope="module")
def helpers(builds):
    _, first, _ = builds
    assert first.returncode == 0, first.stderr
    path = json.loads(first.stdout)["path"]
    spec = importlib.util.spec_from_file_location("gptforge_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_second_build_compiles_nothing(builds):
    cache, first, second = builds
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["built"] is True and b["built"] is False
    assert a["path"] == b["path"] and b["seconds"] < a["seconds"]
    modules = list(cache.rglob("gptforge_helpers*"))
    assert len(modules) == 1


def test_compiled_for_this_interpreter(builds):
    _, first, _ = builds
    report = json.loads(first.stdout)
    assert report["path"].endswith("gptforge_helpers" + sysconfig.get_config_var("EXT_SUFFIX"))
    command = " ".join(report["command"])
    assert f"-I{sysconfig.get_paths()['include']}" in command
    assert "python3-config" not in command
    assert "-ffp-contract=off" in command


def test_cli_prints_a_sentence(cli, builds):
    cache, _, _ = builds
    proc = cli("build", "helpers", env={"GPTFORGE_CACHE": str(cache)})
    assert proc.returncode == 0 and "already built" in proc.stdout


def test_broken_source_is_one_line_error(tmp_path, monkeypatch):
    from gptforge.build.helpers import HelpersBuildError, build_helpers

    monkeypatch.setenv("GPTFORGE_CACHE", str(tmp_path))
    bad = tmp_path / "helpers.cpp"
    bad.write_text("int broken( {\n")
    with pytest.raises(HelpersBuildError, match="compiling helpers.cpp failed") as err:
        build_helpers(source=bad)
    assert "\n" not in err.value.one_line()
    assert not list(tmp_path.rglob("gptforge_helpers*"))


@st.composite
def sample_index_inputs(draw):
    n = draw(st.integers(1, 30))
    sizes = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    if sum(sizes) < 2:
        sizes[0] += 2
    epochs = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    doc_idx = np.concatenate([rng.permutation(n) for _ in range(epochs)]).astype(np.int32)
    per_epoch = int(np.asarray(sizes)[doc_idx].sum()) // epochs
    seq = draw(st.integers(1, 70))
    extra = draw(st.integers(0, 1))
    drop_last = draw(st.booleans())
    if seq == 1 and extra == 0:
        seq = 2
    return np.asarray(sizes, np.int32), doc_idx, seq, epochs, per_epoch, drop_last, extra


def _outcome(fn):
    try:
        return fn()
    except (ValueError, RuntimeError) as err:  # pybind11 maps std::invalid_argument to ValueError
        return type(err).__name__


@settings(max_examples=examples(300), deadline=None)
@given(args=sample_index_inputs(), wide=st.booleans())
def test_sample_index_identical_to_reference(helpers, args, wide):
    sizes, doc_idx, seq, epochs, per_epoch, drop_last, extra = args
    if per_epoch < 1:
        return
    compiled = helpers.build_sample_idx_int64 if wide else helpers.build_sample_idx_int32
    dtype = np.int64 if wide else np.int32
    got = _outcome(lambda: compiled(sizes, doc_idx, seq, epochs, per_epoch, drop_last, extra))
    want = _outcome(lambda: si.reference_build_sample_idx(sizes, doc_idx, seq, epochs, per_epoch, drop_last, extra, dtype=dtype))
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@settings(max_examples=examples(150), deadline=None)
@given(weights=st.lists(st.floats(0.001, 100.0), min_size=1, max_size=6), size=st.integers(0, 3000),
       normalise=st.booleans())
def test_blending_identical_to_reference(helpers, weights, size, normalise):
    w = np.asarray(weights, np.float64)
    if normalise:
        w = w / w.sum()
    dataset_index, sample_index = np.zeros(size, np.int16), np.zeros(size, np.int64)
    helpers.build_blending_indices(dataset_index, sample_index, w, len(w), size, False)
    ref_index, ref_sample = si.reference_build_blending_indices(w, size)
    np.testing.assert_array_equal(dataset_index, ref_index)
    np.testing.assert_array_equal(sample_index, ref_sample)


def test_dispatch_uses_numpy_with_notice_when_not_built(tmp_path, monkeypatch, capsys):
    import gptforge.build.helpers as bh

    monkeypatch.setenv("GPTFORGE_CACHE", str(tmp_path))
    monkeypatch.setattr(bh, "_loaded", None)
    monkeypatch.setattr(si, "_NOTICE_SHOWN", False)
    sizes, doc_idx = np.array([5, 7, 9], np.int32), np.array([2, 0, 1], np.int32)
    rows = si.build_sample_idx(sizes, doc_idx, 4, 1, 21)
    np.testing.assert_array_equal(rows, si.reference_build_sample_idx(sizes, doc_idx, 4, 1, 21))
    si.build_sample_idx(sizes, doc_idx, 4, 1, 21)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NumPy" in err[0] and "gptforge build helpers" in err[0]


def test_gpt_dataset_uses_the_compiled_helpers_when_built(builds, tmp_path, monkeypatch, capsys):
    import gptforge.build.helpers as bh
    from gptforge.data.gpt_dataset import build_gpt_datasets
    from gptforge.data.indexed_writer import IndexedDatasetWriter

    cache, _, _ = builds
    monkeypatch.setenv("GPTFORGE_CACHE", str(cache))
    monkeypatch.setattr(bh, "_loaded", None)
    monkeypatch.setattr(si, "_NOTICE_SHOWN", False)
    module = bh.load_helpers()
    assert module is not None
    calls = []
    compiled = module.build_sample_idx_int32
    monkeypatch.setattr(module, "build_sample_idx_int32", lambda *a: calls.append(a) or compiled(*a))
    with IndexedDatasetWriter(tmp_path / "d", np.uint16) as writer:
        writer.add_documents([np.arange(n) for n in range(5, 105)])
    train, _, _ = build_gpt_datasets(tmp_path / "d", split="1,0,0", seq_length=16, num_samples=(50, 0, 0), cache_dir=tmp_path / "c")
    assert len(train) == 50 and len(calls) == 1
    assert "NumPy" not in capsys.readouterr().err


def test_unusable_cache_is_one_line_error(cli, tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "loop").symlink_to("loop")
    for cache in (tmp_path / "afile", tmp_path / "loop"):
        proc = cli("build", "helpers", env={"GPTFORGE_CACHE": str(cache)})
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "GPTFORGE_CACHE" in proc.stderr, proc.stderr


def _damaged_cache(builds, tmp_path, damage: str):
    cache, first, _ = builds
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    module = next(copy.rglob("gptforge_helpers*"))
    data = module.read_bytes()
    if damage == "fifo":
        module.unlink()
        os.mkfifo(module)
    elif damage.startswith("entry-"):
        (module.parent / "entry.json").write_text("[1]" if damage == "entry-a-list" else "[" * 100_000 + "]" * 100_000)
    else:
        module.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x7fELF" + bytes(4000))
    return copy, module


@pytest.mark.parametrize("damage", ["truncated", "garbage", "fifo", "entry-a-list", "entry-deep"])
def test_a_damaged_module_is_no_cache_hit(builds, tmp_path, damage):
    """What `build helpers` and the import path ask before they trust a cached module: are its bytes the build's?"""
    from gptforge.build.helpers import intact_entry

    copy, module = _damaged_cache(builds, tmp_path, damage)
    assert intact_entry(next(builds[0].rglob("gptforge_helpers*"))) is not None
    assert intact_entry(module) is None


# A rebuild is a compile: the default run rebuilds once, through the import path, and asks the cache about both
# damages above; the command's own rebuild of each runs under slow.
@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_module_is_rebuilt_not_reported_built(builds, tmp_path, damage):
    """A truncated module was 'already built' and training died with SIGBUS; a garbage one raised ImportError."""
    copy, module = _damaged_cache(builds, tmp_path, damage)
    proc = run_cli("build", "helpers", "--json", env={"GPTFORGE_CACHE": str(copy)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["built"] is True
    assert module.read_bytes() == next(builds[0].rglob("gptforge_helpers*")).read_bytes()


@pytest.mark.parametrize("damage", [pytest.param("truncated", marks=pytest.mark.slow), "garbage"])
def test_damaged_module_is_rebuilt_before_import(builds, tmp_path, damage):
    copy, _ = _damaged_cache(builds, tmp_path, damage)
    code = ("from gptforge.data.sample_index import compiled_helpers; m = compiled_helpers(); "
            "print(m is not None and hasattr(m, 'build_sample_idx_int32'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "GPTFORGE_CACHE": str(copy)})
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr
    assert "damaged; compiling them again" in proc.stderr


@pytest.mark.parametrize("cxx,needle", [("  ", "CXX: '  ' names no command"),
                                        ("g++ '-O2", "CXX: \"g++ '-O2\" is not a command (No closing quotation)")])
def test_cxx_that_is_not_a_command(tmp_path, cxx, needle):
    proc = run_cli("build", "helpers", "--force", env={"GPTFORGE_CACHE": str(tmp_path), "CXX": cxx})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert needle in proc.stderr
