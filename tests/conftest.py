"""Helpers the test modules share (they import them from here, never from each other): the installed
``gptforge`` entry point, the real CUDA toolkit, real ELF libraries built with gcc, prefix snapshots,
and the finding codes written in the sources and the docs."""

from __future__ import annotations

import ast
import atexit
import glob
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from gptforge.process import kill_tree
from gptforge.storage import KILL_ENV

# The maintainers' builders (tasks/lockgen, tasks/compatgen) live outside the package; tests import them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tasks"))


def gptforge_executable() -> list[str]:
    script = Path(sys.executable).parent / "gptforge"
    if script.exists():
        return [str(script)]
    found = shutil.which("gptforge")
    if found is None:
        pytest.fail("the gptforge entry point is not installed: pip install -e '.[test]'")
    return [found]


def run_cli(*args: str, env: dict | None = None, cwd: str | os.PathLike | None = None, timeout: float = 600):
    """Run ``gptforge ARGS`` through the installed console script; returns CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [*gptforge_executable(), *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout
    )


def run_main(*args: str, env: dict | None = None, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """``gptforge ARGS`` run in this process, answered as ``run_cli`` answers: for tests of what a command does, not
    of its process (no interpreter start, no torch import per call; each command keeps a test through ``run_cli``).
    ENV is set (a None value unsets the variable) and CWD entered for the call only (OMP_NUM_THREADS sets torch's
    thread count, as at a process's start); an uncaught exception fails the test with its traceback."""
    import contextlib
    import io

    from gptforge.cli import main

    env = env or {}
    if "OMP_NUM_THREADS" in env:
        import torch  # noqa: F401 (its thread count is set below, as a process started with ENV would have it)
    torch = sys.modules.get("torch")
    saved_env, saved_cwd, saved_threads = dict(os.environ), os.getcwd(), torch and torch.get_num_threads()
    out, err = io.StringIO(), io.StringIO()
    try:
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if "OMP_NUM_THREADS" in env:
            torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit:  # argparse
                code = exit.code
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        if torch:  # a CPU run sets torch's thread count for the whole process
            torch.set_num_threads(saved_threads)
    return subprocess.CompletedProcess(["gptforge", *args], code, out.getvalue(), err.getvalue())


def main_one_line(*args: str, expect: int, stream: str = "stderr", last_line: bool = False) -> tuple[int, str]:
    """``run_main(ARGS)``, whose exit status must be EXPECT. For a failure (``expect`` != 0) stderr must be one line,
    which is returned (``last_line``: notes may come before it); ``stream="stdout"`` returns stdout instead (a --json
    report)."""
    done = run_main(*args)
    code = done.returncode
    assert code == expect, (code, done.stdout[-2000:], done.stderr[-2000:])
    if stream == "stdout":
        return code, done.stdout
    if expect == 0:
        return code, done.stderr
    lines = done.stderr.strip("\n").split("\n")
    assert (last_line or len(lines) == 1) and lines[-1].startswith("gptforge"), done.stderr[-3000:]
    return code, lines[-1]


# Property tests draw a fifth of their examples (at least 10) in the default run; CI draws every one (.ci/run sets
# GPTFORGE_TEST_ALL_EXAMPLES=1).
ALL_EXAMPLES = os.environ.get("GPTFORGE_TEST_ALL_EXAMPLES") == "1"


def examples(count: int) -> int:
    """``max_examples`` for a property test written for COUNT examples."""
    return count if ALL_EXAMPLES else max(10, count // 5)


# The benchmark's bookkeeping: the bench/ scripts' dry runs and the committed results re-pooled. Not the product,
# so not the default run; CI runs them (`pytest -m bench`).
BENCH_MODULES = {
    "test_throughput_bench.py", "test_loss_parity.py", "test_parity_pool.py", "test_gpu_clocks.py",
    "test_nanogpt_train.py", "test_sharded_bench.py",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in BENCH_MODULES:
            item.add_marker(pytest.mark.bench)


def pooled_parity(results: str, a_keys: str, pattern: str = "*.json") -> dict:
    """bench/parity_pool.py's JSON over the committed loss-parity files bench/results/loss_parity/RESULTS/PATTERN,
    the runs with A_KEYS as A."""
    root = Path(__file__).resolve().parent.parent
    files = sorted((root / "bench" / "results" / "loss_parity" / results).glob(pattern))
    proc = subprocess.run([sys.executable, str(root / "bench" / "parity_pool.py"), "--a", a_keys, "--json",
                           *map(str, files)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def two_node_agents(train_args: list, cwd: Path, attempt: int, per_node: int, node_envs: list[dict]) -> list:
    """Two torchrun agents started as tasks/slurm_train.sbatch starts one per node: --nnodes=2, a c10d
    rendezvous (here on 127.0.0.1), the job's id as rendezvous id (a requeued job keeps it). Each agent leads a
    session of its own; logs: CWD/attempt<A>-node<N>.log."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agents = []
    for node, env in enumerate(node_envs):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--nproc-per-node={per_node}",
               "--rdzv-id=4242", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "-m", "gptforge", "train",
               *train_args]
        with open(cwd / f"attempt{attempt}-node{node}.log", "w") as log:
            agents.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                           start_new_session=True))
    return agents


def kill_agent(agent: subprocess.Popen) -> None:
    """SIGKILL an agent and every process under it, and wait until they are gone, as Slurm ends a job step's
    tasks: torchrun starts each worker in a session of its own, and a worker whose peers died waits in its NCCL
    collective, holding the run directory's lock, long after its agent is gone."""
    kill_tree(agent.pid)
    agent.wait(timeout=60)


def lose_a_node_and_requeue(train_args: list, cwd: Path, per_node: int, node_envs: list[dict], kill_at: str,
                            timeout: float) -> str:
    """Node 1's workers SIGKILL themselves at KILL_AT; its agent gives up; the other node's tasks are killed as
    srun --kill-on-bad-exit does; the job starts again with the same command. Returns node 0's log of the
    second start (both agents exited 0)."""
    first = two_node_agents(train_args, cwd, 1, per_node, [node_envs[0], {**node_envs[1], KILL_ENV: kill_at}])
    try:
        assert first[1].wait(timeout=timeout) != 0
    finally:
        for agent in first:
            kill_agent(agent)
    second = two_node_agents(train_args, cwd, 2, per_node, node_envs)
    try:
        codes = [agent.wait(timeout=timeout) for agent in second]
    finally:
        for agent in second:
            kill_agent(agent)
    log = (cwd / "attempt2-node0.log").read_text()
    assert codes == [0, 0], log[-3000:] + (cwd / "attempt2-node1.log").read_text()[-3000:]
    return log


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def sm90_here(monkeypatch):
    """An sm_90 GPU where every Hopper kernel can run: FA4, quack and the CuTe DSL (in site-packages), cuDNN."""
    import torch

    from gptforge.accel import hopper

    monkeypatch.setattr(hopper, "sm90", lambda device: True)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(hopper, "HOPPER_MODULES", ("json",))
    monkeypatch.setattr(hopper, "dsl_directory", lambda: "/env/lib/python3.12/site-packages/nvidia_cutlass_dsl")


# The real CUDA toolkit (the probe and doctor tests)

TOOLKIT = os.environ.get("GPTFORGE_TEST_CUDA_ROOT", "/usr/local/cuda")
NVCC = os.path.join(TOOLKIT, "bin", "nvcc")
LIBCUDART = os.path.join(TOOLKIT, "lib64", "libcudart.so")
needs_nvcc = pytest.mark.skipif(not os.path.isfile(NVCC), reason=f"no CUDA toolkit at {TOOLKIT} (set GPTFORGE_TEST_CUDA_ROOT)")
needs_cudart = pytest.mark.skipif(not os.path.exists(LIBCUDART), reason=f"no libcudart under {TOOLKIT}/lib64")


def _real_nvcc_release() -> str:
    out = subprocess.run([NVCC, "--version"], capture_output=True, text=True, check=True).stdout
    return out.split("release ")[1].split(",")[0]


def conda_like_prefix(root, toolkit: str):
    """A CUDA root laid out like a conda env, built from links to the real toolkit's files:
    bin/nvcc, lib/libcudart.so*, headers only in targets/x86_64-linux/include, no lib64."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "nvcc").symlink_to(os.path.join(toolkit, "bin", "nvcc"))
    (root / "lib").mkdir()
    real_lib = os.path.realpath(os.path.join(toolkit, "lib64"))
    for name in os.listdir(real_lib):
        if name.startswith("libcudart.so"):
            (root / "lib" / name).symlink_to(os.path.join(real_lib, name))
    target = root / "targets" / "x86_64-linux"
    target.mkdir(parents=True)
    (target / "include").symlink_to(os.path.realpath(os.path.join(toolkit, "include")))
    (root / "include").mkdir()
    return root


# Finding codes: written in the sources, documented in docs/

def emitted_codes(package: Path) -> set[str]:
    """Every code a ``Finding(...)`` call in the package's modules is written with.

    A Finding whose code is not a string literal fails here: codes are an API and must be greppable.
    """
    codes = set()
    for module in package.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding":
                code = node.args[0] if node.args else next(k.value for k in node.keywords if k.arg == "code")
                assert isinstance(code, ast.Constant), f"{module.name}:{node.lineno}: code is not a literal"
                codes.add(code.value)
    return codes


def documented_codes(doc: Path, section: str) -> set[str]:
    """The codes in the first column of the tables under ``## section`` of a docs page."""
    text = doc.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9-]+)` \|", text, re.M))


# fix-links: real ELF libraries built with gcc, prefix snapshots

_LIB_CACHE = tempfile.mkdtemp(prefix="gptforge-links-libs-")
atexit.register(shutil.rmtree, _LIB_CACHE, ignore_errors=True)
_SOURCE = "int cudaRuntimeGetVersion(int *v) {{ *v = {number}; return 0; }}\n"


def fake_library(soname: str, runtime_number: int) -> str:
    """A real shared library (gcc) with SONAME ``soname`` whose cudaRuntimeGetVersion reports
    ``runtime_number``. Cached per (soname, number); copy it into a prefix, never link to it."""
    out = os.path.join(_LIB_CACHE, f"{soname}-{runtime_number}.so")
    return _built_library(out, soname, _SOURCE.format(number=runtime_number))


def _built_library(out: str, soname: str, source: str) -> str:
    """``out``, compiled by gcc from C ``source`` with SONAME ``soname`` unless it is cached."""
    if not os.path.exists(out):
        if shutil.which("gcc") is None:
            pytest.skip("gcc is needed to build test libraries")
        src = out + ".c"
        with open(src, "w") as f:
            f.write(source)
        tmp = out + ".tmp"
        subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", tmp, src], check=True)
        os.replace(tmp, out)
    return out


# The version functions NVIDIA's libraries export, with their documented signatures (see
# gptforge.links.libversion): a library built from one of these answers like the real one.
_ABI_SOURCE = {
    "runtime": "int {symbol}(int *v) {{ *v = {major} * 1000 + {minor} * 10; return 0; }}\n",
    "major-minor": "int {symbol}(int *a, int *b) {{ *a = {major}; *b = {minor}; return 0; }}\n",
    "property": "int {symbol}(int t, int *v) {{ int p[3] = {{{major}, {minor}, {patch}}}; "
                "if (t < 0 || t > 2) return 7; *v = p[t]; return 0; }}\n",
}


def versioned_library(soname: str, symbol: str, abi: str, version: tuple[int, int, int]) -> str:
    """A real shared library with SONAME ``soname`` whose ``symbol`` reports ``version`` through ``abi``.
    Cached; copy it into a prefix, never link to it."""
    out = os.path.join(_LIB_CACHE, f"{soname}-{symbol}-{'.'.join(map(str, version))}.so")
    source = _ABI_SOURCE[abi].format(symbol=symbol, major=version[0], minor=version[1], patch=version[2])
    return _built_library(out, soname, source)


def runtime_number(version: tuple[int, ...]) -> int:
    return version[0] * 1000 + version[1] * 10


def snapshot(prefix: str) -> dict[str, tuple]:
    """Every name under ``prefix`` -> ('link', text) | ('file', sha256) | ('dir',) | ('other',)."""
    out: dict[str, tuple] = {}
    for root, dirs, files in os.walk(prefix):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, prefix)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                out[rel] = ("dir",)
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    out[rel] = ("file", hashlib.sha256(f.read()).hexdigest())
            else:
                out[rel] = ("other",)
    return out


def dangling(prefix: str) -> set[str]:
    snap = snapshot(prefix)
    return {rel for rel, kind in snap.items() if kind[0] == "link" and not os.path.exists(os.path.join(prefix, rel))}


def regular_files(snap: dict) -> dict:
    return {rel: kind for rel, kind in snap.items() if kind[0] in ("file", "dir")}


def without_state(snap: dict) -> dict:
    """The snapshot without gptforge's own undo-record directory."""
    return {rel: kind for rel, kind in snap.items() if not rel.startswith(".gptforge")}


def write(path: str, data: bytes = b"not a library\n") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def symlink(target: str, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)


def install_library(prefix: str, stem: str, version: tuple[int, ...], *, place: str = "target",
                    soname_major: int | None = None) -> str:
    """Put a real ``stem.so.<version>`` into the prefix the way conda-forge does: the file under
    targets/x86_64-linux/lib and a full-name link in lib (``place='target'``), or the file in lib."""
    name = f"{stem}.so.{'.'.join(map(str, version))}"
    soname = f"{stem}.so.{soname_major if soname_major is not None else version[0]}"
    lib = fake_library(soname, runtime_number(version))
    if place == "target":
        dest = os.path.join(prefix, "targets", "x86_64-linux", "lib", name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(lib, dest)
        if not os.path.lexists(os.path.join(prefix, "lib", name)):
            symlink(f"../targets/x86_64-linux/lib/{name}", os.path.join(prefix, "lib", name))
    else:
        dest = os.path.join(prefix, "lib", name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(lib, dest)
    return dest


def toolkit_dir() -> str:
    """The CUDA toolkit the tests take real files from: $CUDA_HOME, else /usr/local/cuda."""
    return os.environ.get("CUDA_HOME", "/usr/local/cuda")


def toolkit_cudart() -> tuple[str, int]:
    """(path, cudaRuntimeGetVersion) of the toolkit's real libcudart; skips the test without one."""
    from gptforge.links.libversion import load_versions

    cuda = toolkit_dir()
    found = [p for p in glob.glob(os.path.join(cuda, "lib*", "libcudart.so.*")) if not os.path.islink(p)]
    if not found:
        pytest.skip(f"no real libcudart under {cuda}/lib64 (set CUDA_HOME to a CUDA toolkit)")
    path = sorted(found)[-1]
    loaded = load_versions([path])[0]
    if loaded.version is None:
        pytest.skip(f"the toolkit's libcudart cannot be loaded here: {loaded.error}")
    return path, loaded.version


@pytest.fixture
def env(tmp_path):
    """A small conda-forge-like prefix with a CUDA 12.8 runtime behind a wrong libcudart.so."""
    prefix = str(tmp_path / "env")
    install_library(prefix, "libcudart", (12, 8, 90))
    install_library(prefix, "libcudart", (12, 4, 127), place="lib")
    symlink("libcudart.so.12.4.127", os.path.join(prefix, "lib", "libcudart.so"))
    symlink("libcudart.so.12.4.127", os.path.join(prefix, "lib", "libcudart.so.12"))
    write(os.path.join(prefix, "targets/x86_64-linux/include/cuda_runtime.h"), b"/* 12.8 */\n")
    write(os.path.join(prefix, "conda-meta", "cuda-version-12.8-h5d125a7_3.json"),
          json.dumps({"name": "cuda-version", "version": "12.8"}).encode())
    return prefix


ACTIVATION_VARS = ("CONDA_PREFIX", "PIXI_PROJECT_ROOT", "PIXI_ENVIRONMENT_NAME")  # what an active environment sets


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ACTIVATION_VARS}


# gptforge doctor, run as a user runs it

SCHEMA = json.loads(resources.files("gptforge").joinpath("schemas/doctor.schema.json").read_text())
BUILD_VARS = ("CUDA_HOME", "CUDA_PATH", "CC", "CXX", "CUDAHOSTCXX", "NVCC_CCBIN")


def doctor(*args: str, unset=BUILD_VARS, **env: str) -> subprocess.CompletedProcess:
    """Run the installed `gptforge doctor ARGS` with the build variables cleared, then ``env`` set."""
    full = {k: v for k, v in os.environ.items() if k not in unset}
    full.update(env)
    done = subprocess.run([*gptforge_executable(), "doctor", *args], capture_output=True, text=True, env=full,
                          timeout=300)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


def doctor_json(*args: str, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    done = doctor("--json", *args, **env)
    data = json.loads(done.stdout)
    Draft202012Validator(SCHEMA).validate(data)
    return done, data


def codes(data: dict, severity: str | None = None) -> set[str]:
    return {f["code"] for f in data["findings"] if severity is None or f["severity"] == severity}


# gptforge train: tiny models that train in seconds on a CPU, and the one-line error every failure prints

SMALL = ["num-layers=1", "hidden-size=32", "num-attention-heads=2", "seq-length=32", "max-position-embeddings=32",
         "micro-batch-size=4", "global-batch-size=8", "train-iters=12", "save-interval=4", "eval-interval=4",
         "eval-iters=2", "log-interval=4", "lr-warmup-iters=2", "dropout=0.1"]
TINY = ["num-layers=1", "hidden-size=32", "num-attention-heads=2", "seq-length=32", "max-position-embeddings=32",
        "micro-batch-size=4", "global-batch-size=4", "eval-iters=1", "lr-warmup-iters=1"]


@pytest.fixture(scope="session")
def train_data_cache(tmp_path_factory):
    """The data-cache-dir CPU training runs share: the embedded corpus is built once a session, not once a run.
    The xdist workers share it too (their base directories' parent): the build holds a file lock."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "train-data-cache"


@pytest.fixture()
def workspace(tmp_path):
    """A copy of the project's pixi workspace (manifest, pyproject, lock, envs/) to check or mutate."""
    root = Path(__file__).resolve().parents[1]
    for name in ("pixi.toml", "pyproject.toml", "pixi.lock"):
        shutil.copy(root / name, tmp_path / name)
    shutil.copytree(root / "envs", tmp_path / "envs")
    return tmp_path


def tiny_train_args(run_dir, cache, *extra) -> list[str]:
    """`gptforge train` of the SMALL gpt2-tiny shape into RUN_DIR, on the shared data cache."""
    return ["train", "--config", "gpt2-tiny", "--run-dir", str(run_dir), *SMALL, f"data-cache-dir={cache}", *extra]


@pytest.fixture(scope="session")
def tiny_trained_run(tmp_path_factory, train_data_cache):
    """A run directory of four SMALL steps, trained once a session; tests tamper with copies (`tiny_run_copy`)."""
    run_dir = tmp_path_factory.mktemp("tiny-trained") / "run"
    main_one_line(*tiny_train_args(run_dir, train_data_cache, "train-iters=4"), expect=0)
    return run_dir


@pytest.fixture
def tiny_run_copy(tiny_trained_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(tiny_trained_run, copy, symlinks=True)
    return copy


def one_line_error(proc, code: int, *needles: str) -> None:
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
