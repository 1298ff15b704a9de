"""Checkpoints as untrusted input: no file a resume or a sample reads can run code, damage is named,
a run directory has one writer, and a torn metrics line or a missing RNG file is handled."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import run_main, tiny_train_args
from gptforge.errors import GptforgeError
from gptforge.train import checkpoint

FILES_READ = {"resume": ["trainer.pt", "model.pt", "optimizer.pt", "rng_rank0.pt"],
              "sample": ["trainer.pt", "model.pt"]}


class Payload:
    """What an attacker puts in a shared checkpoint: unpickling it runs a shell command."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def train(run_dir, cache, *extra):
    """`gptforge train` of the session's four-step run (conftest's tiny_trained_run), in this process."""
    return run_main(*tiny_train_args(run_dir, cache, "train-iters=4", *extra), cwd=run_dir.parent)


@pytest.fixture(scope="session")
def cache(train_data_cache):
    return train_data_cache


@pytest.fixture
def trained(tiny_trained_run):
    return tiny_trained_run


@pytest.fixture
def run(tiny_run_copy):
    return tiny_run_copy


def newest(run_dir):
    return checkpoint.latest(run_dir / "checkpoints")


def one_line_error(proc, *words):
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gptforge: "), proc.stderr[-3000:]
    for word in words:
        assert word in last, last


def plant(ckpt, name, marker):
    """Replace one file with the crafted pickle and re-sign the checkpoint, as an attacker can."""
    torch.save({"x": Payload(f"touch {marker}")}, ckpt / name)
    if hasattr(checkpoint, "write_checksums"):  # the attacker's planting does not depend on the defence
        checkpoint.write_checksums(ckpt)


def test_the_payload_runs_under_plain_unpickling(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"x": Payload(f"touch {marker}")}, tmp_path / "evil.pt")
    torch.load(tmp_path / "evil.pt", weights_only=False)  # what a trusting loader does
    assert marker.exists()


# one file per command in the default run (every load is weights-only: test_every_torch_load_in_the_package_is_weights_only)
@pytest.mark.parametrize("command,name", [pytest.param(c, n, marks=[] if n == names[0] else pytest.mark.slow)
                                          for c, names in FILES_READ.items() for n in names])
def test_crafted_pickle_runs_nothing(run, cache, tmp_path, command, name):
    marker = tmp_path / "ran"
    plant(newest(run), name, marker)
    if command == "resume":
        proc = train(run, cache, "--resume", "train-iters=8")
    else:
        proc = run_main("sample", "--checkpoint", str(run), "--max-new-tokens", "4", "--device", "cpu")
    assert not marker.exists(), "the checkpoint ran code"
    one_line_error(proc, name)


def test_every_torch_load_in_the_package_is_weights_only():
    """No call site can reintroduce a trusting load (DeepSpeed's own loads go through force_weights_only)."""
    import gptforge

    root = os.path.dirname(gptforge.__file__)
    found = subprocess.run(["grep", "-rn", "weights_only=False", root], capture_output=True, text=True).stdout
    assert found == ""


def test_forced_weights_only_refuses_a_trusting_caller(tmp_path):
    """DeepSpeed calls torch.load(weights_only=False) itself; under force_weights_only that load is safe."""
    from gptforge.train.deepspeed_engine import force_weights_only

    marker = tmp_path / "ran"
    torch.save({"x": Payload(f"touch {marker}")}, tmp_path / "mp_rank_00_model_states.pt")
    with force_weights_only(), pytest.raises(Exception):
        torch.load(tmp_path / "mp_rank_00_model_states.pt", weights_only=False)
    assert not marker.exists()
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ  # restored afterwards


def test_checksums_cover_every_file_of_a_checkpoint(trained):
    ckpt = newest(trained)
    listed = json.loads((ckpt / checkpoint.CHECKSUMS_FILE).read_text())["files"]
    on_disk = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file() and p.name != checkpoint.CHECKSUMS_FILE)
    assert sorted(listed) == on_disk and {"model.pt", "optimizer.pt", "trainer.pt", "rng_rank0.pt"} <= set(listed)


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_flipped_bytes_are_named_by_resume_and_sample(run, cache):
    flip_a_byte(newest(run) / "model.pt")
    one_line_error(train(run, cache, "--resume", "train-iters=8"), "model.pt", "checksum")
    one_line_error(run_main("sample", "--checkpoint", str(run), "--device", "cpu"), "model.pt", "checksum")


@pytest.mark.parametrize("name", ["optimizer.pt", "trainer.pt", "rng_rank0.pt", "deepspeed/mp_rank_00_model_states.pt"])
def test_every_damaged_file_is_named(trained, tmp_path, name):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(newest(trained), ckpt)
    (ckpt / "deepspeed").mkdir()
    torch.save({"module": {}}, ckpt / "deepspeed" / "mp_rank_00_model_states.pt")
    checkpoint.write_checksums(ckpt)
    checkpoint.verify(ckpt)
    flip_a_byte(ckpt / name)
    with pytest.raises(GptforgeError, match=f"{name}: checksum mismatch"):
        checkpoint.verify(ckpt)


def test_missing_rng_file_refuses_the_resume(run, cache):
    ckpt = newest(run)
    (ckpt / "rng_rank0.pt").unlink()
    checkpoint.write_checksums(ckpt)  # even a consistent checkpoint without it cannot resume exactly
    one_line_error(train(run, cache, "--resume", "train-iters=8"), "rng_rank0.pt", "exact")


def test_torn_metrics_line_is_truncated_on_resume(run, cache):
    metrics = run / "metrics.jsonl"
    whole = metrics.read_text()
    metrics.write_text(whole + '{"kind": "train", "step": 5, "lo')  # a crash in the middle of a write
    proc = train(run, cache, "--resume", "train-iters=8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]  # every line parses
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 9))


def test_a_torn_line_before_the_end_is_still_an_error(run, cache):
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text(lines[0] + '{"kind": "tr\n' + "".join(lines[1:]))
    one_line_error(train(run, cache, "--resume", "train-iters=8"), "metrics.jsonl")


def test_second_run_in_the_same_directory_is_refused(run, cache, tmp_path):
    from gptforge.train.rundir import lock

    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom gptforge.train.rundir import lock\n"
                               f"lock({str(run)!r})\nprint('locked', flush=True)\ntime.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = sorted(p.name for p in (run / "checkpoints").iterdir())
        proc = train(run, cache, "--resume", "train-iters=8")
        one_line_error(proc, str(holder.pid), os.uname().nodename)
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
    finally:
        holder.kill()
        holder.wait()
    lock(run).release()  # the holder's death freed it


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB file system (tmpfs): room for a config, not for a checkpoint."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(disk, leave_bytes: int) -> None:
    free = shutil.disk_usage(disk).free
    (disk / "filler").write_bytes(b"\0" * max(free - leave_bytes, 0))


def test_full_disk_during_checkpoint_save_keeps_the_old_one(run, cache, small_disk):
    moved = small_disk / "run"
    shutil.copytree(run, moved)
    step4 = {p.name: p.read_bytes() for p in newest(moved).iterdir()}
    fill(small_disk, 64 * 1024)  # room for config and metrics, not for model.pt
    proc = train(moved, cache, "--resume", "train-iters=8")
    one_line_error(proc, "No space left", "free", str(moved / "checkpoints"))
    assert newest(moved).name == "step_00000004"
    assert {p.name: p.read_bytes() for p in newest(moved).iterdir()} == step4
    assert not [p for p in (moved / "checkpoints").iterdir() if p.name.startswith(".tmp-")]


def test_full_disk_during_config_write(run, cache, small_disk):
    moved = small_disk / "run"
    shutil.copytree(run, moved)
    fill(small_disk, 0)
    proc = train(moved, cache, "--resume", "train-iters=8")
    one_line_error(proc, "No space left", "free", str(moved))
    assert json.loads((newest(moved) / checkpoint.CHECKSUMS_FILE).read_text())
