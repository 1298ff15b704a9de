"""FSDP2 on CPU (gloo): the engine's state survives a DCP round trip exactly, blocks kept whole through a step
train as resharded ones do, its checkpoint index is read without running code, two processes reproduce one
process with accumulation 2, a run killed mid-step resumes to the same losses bit for bit, and so does a job of
two simulated nodes (two torchrun agents, c10d rendezvous on 127.0.0.1, as tasks/slurm_train.sbatch starts
them) that loses one and is requeued."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

from conftest import lose_a_node_and_requeue, run_cli, run_main

torch = pytest.importorskip("torch")

SMALL = ["--config", "gpt2-tiny", "num-layers=2", "hidden-size=32", "num-attention-heads=2", "seq-length=32",
         "max-position-embeddings=32", "micro-batch-size=4", "global-batch-size=16", "train-iters=6",
         "save-interval=3", "eval-interval=3", "eval-iters=1", "lr-warmup-iters=1", "dropout=0.0"]


def losses(run_dir) -> list[tuple]:
    return [(r["kind"], r["step"], r["loss"]) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def torchrun(run_dir, cache, unit, *extra, kill_at=None, cwd=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"GPTFORGE_TEST_KILL_AT": kill_at} if kill_at else {})}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "gptforge",
         "train", "--fsdp", "--fsdp-unit", unit, "--run-dir", str(run_dir), *SMALL, f"data-cache-dir={cache}", *extra],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=900)


@pytest.fixture
def group():
    from gptforge.train import distributed

    env, device = distributed.init("cpu", False, group=True)
    yield env, device
    distributed.shutdown(env)


def tiny_engine(cfg, device, env, unit):
    from gptforge.model.gpt import GPT
    from gptforge.train import checkpoint, fsdp
    from gptforge.train.optim import build_optimizer
    from gptforge.train.precision import choose

    checkpoint.seed_all(cfg.seed)
    model = GPT(cfg.model_config(64)).to(device)
    precision = choose("auto", device)
    fsdp.shard(model, cfg, precision, device, env.world_size, {}, unit)
    optimizer, _ = build_optimizer(model, cfg, fused=False)
    return fsdp.FSDPEngine(model, optimizer, cfg, precision, accum=2, unit=unit)


@pytest.mark.parametrize("unit", ["block", "model"])
def test_engine_state_round_trips_through_dcp(group, tmp_path, unit):
    from gptforge.train import checkpoint
    from gptforge.train.config import load_config

    env, device = group
    cfg, _ = load_config("gpt2-tiny", ["num-layers=2", "hidden-size=32", "num-attention-heads=2", "seq-length=16",
                                       "max-position-embeddings=16", "lr-warmup-iters=1"])
    engine = tiny_engine(cfg, device, env, unit)
    x = torch.randint(0, 64, (4, 16))
    for _ in range(2):
        for micro in range(2):
            engine.micro_step(x, x, is_last=micro == 1)
        engine.step()
    engine.save_collective(tmp_path)
    model_state, optimizer_state, extra = engine.state()
    assert optimizer_state is None and (tmp_path / "fsdp" / ".metadata").is_file()
    assert model_state["wte.weight"].shape == (64, 32)  # whole weights for `gptforge sample`, names unchanged
    checkpoint.write_checksums(tmp_path)

    other = tiny_engine(cfg, device, env, "block" if unit == "model" else "model")  # either unit reads the other's
    other.load(tmp_path, extra)
    assert other.scheduler.last_epoch == 2
    for (name, a), (_, b) in zip(engine.model.named_parameters(), other.model.named_parameters()):
        assert torch.equal(a.full_tensor(), b.full_tensor()), name
    saved, loaded = engine.optimizer.state_dict()["state"], other.optimizer.state_dict()["state"]
    assert saved.keys() == loaded.keys()
    for key in saved:
        assert torch.equal(saved[key]["exp_avg"].full_tensor(), loaded[key]["exp_avg"].full_tensor())
        assert float(saved[key]["step"]) == float(loaded[key]["step"]) == 2
    # the next step is the same step
    for e in (engine, other):
        for micro in range(2):
            e.micro_step(x, x, is_last=micro == 1)
    assert torch.equal(engine.step(), other.step())


def test_compiled_blocks_share_one_graph_and_leave_the_engines_hooks_outside_it():
    """An engine's hook on a block that torch.compile cannot trace (ZeRO-3's, which read each module's id and
    gather its weights) would break the block's graph and be compiled on its own for every block;
    compile_blocks keeps the hooks out of what it compiles."""
    from torch._dynamo.utils import counters

    from gptforge.model.config import ModelConfig
    from gptforge.model.gpt import GPT
    from gptforge.train.engine import compile_blocks

    torch._dynamo.reset()
    counters.clear()
    model = GPT(ModelConfig(4, 32, 2, 16, 64))
    seen = []

    def untraceable_hook(module, args):
        torch._dynamo.graph_break()
        seen.append(module.hook_id)

    for i, block in enumerate(model.blocks):
        block.hook_id = i
        block.register_forward_pre_hook(untraceable_hook)
    compile_blocks(model, {"backend": "aot_eager"})
    x = torch.randint(0, 64, (2, 16))
    for _ in range(2):
        model(x, x)[1].backward()
    assert seen == [0, 1, 2, 3] * 2
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]


class RunsCode:
    def __reduce__(self):
        return (os.system, ("true",))


def test_checkpoint_index_that_would_run_code_is_refused(tmp_path):
    from gptforge.errors import GptforgeError
    from gptforge.train.fsdp import SafeReader

    (tmp_path / ".metadata").write_bytes(pickle.dumps(RunsCode()))
    with pytest.raises(GptforgeError, match="refused to read .*Unsupported global: posix.system"):
        SafeReader(tmp_path).read_metadata()


@pytest.mark.parametrize("make", [lambda p: p.write_bytes(b""), lambda p: p.write_bytes(pickle.dumps({"a": 1})[:-3]),
                                  lambda p: p.write_bytes(b"garbage"), os.mkfifo, os.mkdir],
                         ids=["empty", "truncated", "garbage", "fifo", "directory"])
def test_a_damaged_checkpoint_index_is_one_error(tmp_path, make):
    """Not a traceback, nor a wait on a FIFO: the index is read as the bounded reader reads."""
    from gptforge.errors import GptforgeError
    from gptforge.train.fsdp import SafeReader

    make(tmp_path / ".metadata")
    with pytest.raises(GptforgeError, match=r"\.metadata"):
        SafeReader(tmp_path).read_metadata()


@pytest.mark.parametrize("flags, named", [(["--fsdp", "--deepspeed", "zero2"], "--fsdp"),
                                          (["--fsdp-unit", "model"], "--fsdp-unit")])
def test_engine_flags_that_do_not_go_together_are_usage_errors(tmp_path, flags, named):
    proc = run_main("train", "--run-dir", str(tmp_path / "run"), *flags, cwd=tmp_path)
    assert proc.returncode == 2
    assert named in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) <= 2
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("unit", ["block", "model"])
def test_two_process_fsdp_matches_accumulation_and_resumes_exactly(tmp_path_factory, tmp_path, unit):
    cache = tmp_path_factory.getbasetemp() / "train-data-cache"
    single = run_cli("train", "--run-dir", str(tmp_path / "single"), *SMALL, f"data-cache-dir={cache}",
                     cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert single.returncode == 0, single.stderr[-3000:]
    ref = torchrun(tmp_path / "ref", cache, unit, "--json", cwd=tmp_path)
    assert ref.returncode == 0, ref.stdout[-2000:] + ref.stderr[-3000:]
    notes = {note["code"]: note["message"] for note in json.loads(ref.stdout)["notes"]}
    assert "2 processes (cpu)" in notes["fsdp"] and "accumulation 2 x data-parallel 2" in ref.stderr
    a, b = losses(tmp_path / "single"), losses(tmp_path / "ref")
    assert [x[:2] for x in a] == [x[:2] for x in b]
    for (_, _, la), (_, _, lb) in zip(a, b):
        assert lb == pytest.approx(la, rel=1e-4)

    killed = torchrun(tmp_path / "run", cache, unit, kill_at="step:5", cwd=tmp_path)
    assert killed.returncode != 0 and "SIGKILL" in killed.stderr
    assert (tmp_path / "run" / "checkpoints" / "step_00000003" / "fsdp" / "__1_0.distcp").is_file()
    other_engine = run_cli("train", "--run-dir", str(tmp_path / "run"), *SMALL, f"data-cache-dir={cache}", "--resume",
                           cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert other_engine.returncode == 2 and "written with FSDP" in other_engine.stderr
    resumed = torchrun(tmp_path / "run", cache, unit, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert losses(tmp_path / "run") == losses(tmp_path / "ref")  # bit for bit on CPU

    sample = run_cli("sample", "--checkpoint", str(tmp_path / "run"), "--max-new-tokens", "5", "--json", cwd=tmp_path)
    assert sample.returncode == 0, sample.stderr[-2000:]
    assert json.loads(sample.stdout)["completion"]


@pytest.mark.slow
def test_two_nodes_lose_one_requeue_and_resume_exactly(tmp_path_factory, tmp_path):
    cache = tmp_path_factory.getbasetemp() / "train-data-cache"
    ref = torchrun(tmp_path / "ref", cache, "block", cwd=tmp_path)
    assert ref.returncode == 0, ref.stdout[-2000:] + ref.stderr[-3000:]
    train = ["--fsdp", "--run-dir", str(tmp_path / "run"), "--resume", *SMALL, f"data-cache-dir={cache}"]
    node = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = lose_a_node_and_requeue(train, tmp_path, 1, [node, node], "step:5", timeout=600)
    assert "(step 3)" in log
    assert losses(tmp_path / "run") == losses(tmp_path / "ref")
