"""On 2 GPUs or more: a sharded run (DeepSpeed ZeRO-2, ZeRO-3, FSDP2) killed mid-step resumes to the losses of
the unbroken run, and two torchrun agents (of 2 GPUs each on a 4-GPU host, of 1 on a 2-GPU one), joined by a
c10d rendezvous on 127.0.0.1 as tasks/slurm_train.sbatch starts them on two nodes, survive one node's loss:
the job is torn down (srun --kill-on-bad-exit), requeued with the same command, and continues from the
newest checkpoint."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from conftest import lose_a_node_and_requeue

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
# marks, not a skip at import: outside `pytest -m gpu` the module is deselected instead of skipped
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS < 2, reason="needs 2 NVIDIA GPUs")]

RUN = ["--config", "gpt2-tiny", "--device", "cuda", "train-iters=30", "save-interval=10", "eval-interval=10",
       "eval-iters=2", "log-interval=10", "micro-batch-size=8", "global-batch-size=32", "compile=true"]
ENGINES = {"zero2": ["--deepspeed", "zero2"], "zero2-deepcompile": ["--deepspeed", "zero2-deepcompile.json"],
           "zero3": ["--deepspeed", "zero3"], "fsdp": ["--fsdp"], "fsdp-block": ["--fsdp", "--fsdp-unit", "block"]}
TOLERANCE = 1e-3
PER_NODE = 2 if GPUS >= 4 else 1  # GPUs per simulated node
TIMEOUT = 150  # seconds for one launch


def history(run_dir) -> list[tuple]:
    return [(r["kind"], r["step"], r["loss"]) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def assert_same_losses(ref, run) -> None:
    a, b = history(ref), history(run)
    assert [x[:2] for x in a] == [x[:2] for x in b]
    worst = max(abs(la - lb) for (_, _, la), (_, _, lb) in zip(a, b))
    assert worst <= TOLERANCE, (worst, a, b)


def gpu_ids(first: int, count: int) -> str:
    """GPUs FIRST .. FIRST+COUNT-1 of those this process may use, as CUDA_VISIBLE_DEVICES names them."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = visible.split(",") if visible else [str(i) for i in range(GPUS)]
    return ",".join(names[first:first + count])


def env_for(tmp_path, gpus: str, kill_at: str | None = None) -> dict:
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "OMP_NUM_THREADS": "2",
           "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("GPTFORGE_TEST_KILL_AT", None)
    return {**env, "GPTFORGE_TEST_KILL_AT": kill_at} if kill_at else env


def cache(tmp_path) -> str:
    return f"data-cache-dir={tmp_path.parent / 'sharded-data-cache'}"  # the corpus prepared once for every test


def torchrun(tmp_path, run_dir, engine_args, *extra, nproc=2, kill_at=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "gptforge",
           "train", "--run-dir", str(run_dir), *RUN, cache(tmp_path), *engine_args, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=env_for(tmp_path, gpu_ids(0, nproc), kill_at), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers: a hung collective must not hold the GPUs
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd[5:9])} ran past {TIMEOUT} s: {out[-2000:]}{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_sharded_run_killed_mid_step_resumes_to_the_same_losses(tmp_path, engine):
    if engine.startswith("zero") and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("DeepSpeed is not installed")
    if engine == "zero2-deepcompile":  # the packaged zero2.json with DeepCompile on; the resumed run goes on without it
        from gptforge.train.deepspeed_engine import resolve_deepspeed_config

        config = json.loads(open(resolve_deepspeed_config("zero2")).read())
        (tmp_path / ENGINES[engine][1]).write_text(json.dumps({**config, "compile": {"deepcompile": True}}))
    ref = torchrun(tmp_path, tmp_path / "ref", ENGINES[engine])
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    killed = torchrun(tmp_path, tmp_path / "run", ENGINES[engine], kill_at="step:17")
    assert killed.returncode != 0
    resumed = torchrun(tmp_path, tmp_path / "run", ENGINES[engine], "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "(step 10)" in resumed.stdout
    assert_same_losses(tmp_path / "ref", tmp_path / "run")


def test_two_nodes_lose_one_requeue_and_resume(tmp_path):
    train = ["--run-dir", str(tmp_path / "run"), "--resume", *RUN, cache(tmp_path), "global-batch-size=64", "compile=false"]
    ref = torchrun(tmp_path, tmp_path / "ref", [], "global-batch-size=64", "compile=false", nproc=2 * PER_NODE)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    nodes = [env_for(tmp_path, gpu_ids(node * PER_NODE, PER_NODE)) for node in (0, 1)]
    log = lose_a_node_and_requeue(train, tmp_path, PER_NODE, nodes, "step:17", TIMEOUT)
    assert "(step 10)" in log
    assert_same_losses(tmp_path / "ref", tmp_path / "run")
