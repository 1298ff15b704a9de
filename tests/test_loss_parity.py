"""bench/loss_parity.py: two same-seed runs on the embedded corpus, compared curve by curve."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "loss_parity.py"
sys.path.insert(0, str(SCRIPT.parent))
import loss_parity  # noqa: E402


def run_script(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """The script on the CPU with gpt2-tiny, its JSON (and the corpus cache) under TMP_PATH."""
    return subprocess.run([sys.executable, str(SCRIPT), "--config", "gpt2-tiny", "--device", "cpu", *args],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "GPTFORGE_BENCH_OUT": str(tmp_path)}, timeout=600)


def test_the_default_pair_trains_one_curve_on_cpu(tmp_path):
    proc = run_script(tmp_path, "--steps", "8", "--batch", "4", "--max-diff", "1e-4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "loss_parity.json").read_text())
    a, b = report["runs"]["a"], report["runs"]["b"]
    assert len(a["losses"]) == len(b["losses"]) == 8
    assert a["keys"][-1] == "accel=none" and b["keys"][-1] == "accel=triton"
    assert a["losses"][-1] < a["losses"][0]  # it trained
    assert report["a_vs_b"]["max_abs"] < 1e-4  # fp32 on CPU: only summation order differs
    assert "a vs b: max |diff|" in proc.stdout
    assert not (tmp_path / ".gptforge").exists()  # the corpus cache went to the run's temporary directory


def test_a_run_whose_keys_cannot_run_here_fails_the_comparison(tmp_path, train_data_cache):
    # the session's built corpus instead of one built for this run: the test above checks where the script's own goes
    cache = f"data-cache-dir={train_data_cache}"
    proc = run_script(tmp_path, "--steps", "2", "--batch", "2", "--a", cache, "--b", f"accel=hopper,{cache}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "accel: hopper: its kernels need an sm_90 GPU" in proc.stderr.strip().splitlines()[-1]
    report = json.loads((tmp_path / "loss_parity.json").read_text())
    assert list(report["runs"]) == ["a"] and report["complete"] is False


def test_a_from_another_source_tree(tmp_path, monkeypatch):
    trained = []
    monkeypatch.setattr(loss_parity, "train_once",
                        lambda config, keys, run_dir, device, src=None: trained.append((run_dir.name, src)) or fake_run(3.0))
    monkeypatch.setenv("GPTFORGE_BENCH_OUT", str(tmp_path))
    (tmp_path / "before" / "src" / "gptforge").mkdir(parents=True)
    args = ["--config", "gpt2-tiny", "--steps", "2", "--batch", "2", "--a", "a-key-only-that-tree-knows=1"]
    assert loss_parity.main([*args, "--a-src", str(tmp_path / "before"), "--repeat-a"]) == 0
    assert trained == [("a", tmp_path / "before"), ("b", None), ("a2", tmp_path / "before")]
    assert json.loads((tmp_path / "loss_parity.json").read_text())["a_src"] == str(tmp_path / "before")
    assert loss_parity.main([*args, "--a-src", str(tmp_path)]) == 2  # no src/gptforge there


def test_jobs_train_side_by_side_to_the_losses_of_one_at_a_time(tmp_path, train_data_cache):
    cache = f"data-cache-dir={train_data_cache}"
    keys = ["--steps", "3", "--batch", "2", "--a", f"lr=1e-3,{cache}", "--b", f"lr=2e-3,{cache}"]
    (tmp_path / "side").mkdir()
    (tmp_path / "alone").mkdir()
    side = run_script(tmp_path / "side", *keys, "--seeds", "1,2", "--jobs", "2")
    alone = run_script(tmp_path / "alone", *keys, "--seeds", "2")
    assert side.returncode == alone.returncode == 0, side.stderr + alone.stderr
    side_runs = json.loads((tmp_path / "side" / "loss_parity.json").read_text())["runs"]
    alone_runs = json.loads((tmp_path / "alone" / "loss_parity.json").read_text())["runs"]
    assert list(side_runs) == ["a@1", "b@1", "a@2", "b@2"]  # plan order, whichever finished first
    assert [side_runs[n]["losses"] for n in ("a@2", "b@2")] == [alone_runs[n]["losses"] for n in ("a@2", "b@2")]
    assert loss_parity.main(["--jobs", "0"]) == 2


def test_curve_diff_reports_max_mean_and_tail():
    d = loss_parity.curve_diff([1.0] * 10, [1.0] * 9 + [1.5])
    assert d == {"max_abs": 0.5, "mean_abs": pytest.approx(0.05), "tail_mean_abs": 0.5}


def test_bad_key_exits_2_before_training(capsys):
    assert loss_parity.main(["--b", "compile=maybe", "--steps", "10"]) == 2
    err = capsys.readouterr().err
    assert "compile must be bool" in err and len(err.strip().splitlines()) == 1


def test_signed_drift_is_the_mean_b_minus_a_over_the_last_half():
    a = [5.0, 4.0, 3.0, 2.0]
    assert loss_parity.signed_drift(a, [9.0, 9.0, 3.5, 2.5]) == pytest.approx(0.5)  # the first half is ignored
    assert loss_parity.signed_drift(a, [5.0, 4.0, 2.0, 1.0]) == pytest.approx(-1.0)  # signed
    assert loss_parity.signed_drift(a, [5.0, 4.0, 3.1, 1.9]) == pytest.approx(0.0)  # noise cancels, |diff| would not


def test_mean_and_stderr():
    assert loss_parity.mean_and_stderr([1.0, 2.0, 3.0]) == {"mean": 2.0, "stderr": pytest.approx(1 / 3 ** 0.5)}
    assert loss_parity.mean_and_stderr([0.25]) == {"mean": 0.25, "stderr": None}
    assert loss_parity.mean_and_stderr([]) == {"mean": None, "stderr": None}


def test_the_plan_pairs_a_and_b_per_seed_and_repeats_a_on_every_seed():
    plans = loss_parity.plan(["x=1"], ["x=2"], [7, 3], repeat_a=True)
    assert plans == [("a@7", ["x=1", "seed=7"]), ("b@7", ["x=2", "seed=7"]), ("a2@7", ["x=1", "seed=7"]),
                     ("a@3", ["x=1", "seed=3"]), ("b@3", ["x=2", "seed=3"]), ("a2@3", ["x=1", "seed=3"])]
    assert loss_parity.plan(["x=1"], ["x=2"], [], repeat_a=False) == [("a", ["x=1"]), ("b", ["x=2"])]
    assert loss_parity.plan(["x=1"], ["x=2"], [7, 3], repeat_a=False, only_b=True) == [
        ("b@7", ["x=2", "seed=7"]), ("b@3", ["x=2", "seed=3"])]


def test_only_b_trains_b_on_every_seed_for_the_pool_and_refuses_what_needs_a(tmp_path, monkeypatch, capsys):
    trained = []
    monkeypatch.setattr(loss_parity, "train_once", lambda config, keys, run_dir, device: trained.append(keys) or fake_run(3.0))
    monkeypatch.setenv("GPTFORGE_BENCH_OUT", str(tmp_path))
    assert loss_parity.main(["--config", "gpt2-tiny", "--seeds", "1,2", "--steps", "2", "--batch", "2", "--only-b"]) == 0
    assert all("accel=triton" in keys for keys in trained) and len(trained) == 2  # B's keys only
    report = json.loads((tmp_path / "loss_parity.json").read_text())
    assert list(report["runs"]) == ["b@1", "b@2"] and report["complete"] is True and report["seeds"] == []
    assert "pool these B runs" in capsys.readouterr().out
    for extra, problem in (([], "give --seeds too"), (["--seeds", "1", "--repeat-a"], "drop --repeat-a")):
        assert loss_parity.main(["--config", "gpt2-tiny", "--only-b", *extra]) == 2
        assert problem in capsys.readouterr().err


def test_each_seeds_rerun_of_a_gives_the_noise_floor_that_bs_drifts_are_read_against():
    def run(tail: float) -> dict:
        return {"keys": [], "losses": [9.0, 9.0, tail, tail], "final_val_loss": tail, "notes": []}

    runs = {"a@1": run(3.0), "b@1": run(3.3), "a2@1": run(3.1), "a@2": run(2.0), "b@2": run(1.6), "a2@2": run(1.8),
            "a@5": run(4.0), "b@5": run(4.0)}  # seed 5: no rerun
    rows = loss_parity.seed_rows([1, 2, 5], runs)
    assert [row["aa_drift"] for row in rows] == [pytest.approx(0.1), pytest.approx(-0.2), None]
    summary = loss_parity.seed_summary(rows, runs)
    assert summary["aa_drift"]["mean"] == pytest.approx(-0.05)
    assert summary["rms"]["drift"] == pytest.approx(((0.09 + 0.16 + 0) / 3) ** 0.5)
    assert summary["rms"]["aa_drift"] == pytest.approx(((0.01 + 0.04) / 2) ** 0.5) and summary["rms"]["aa_runs"] == 2


@pytest.mark.parametrize("seeds, problem", [("1,x", "'x' is not a whole number"), ("1,-2", "-2 is outside [0, 2**32)"),
                                            (str(2**32), f"{2**32} is outside [0, 2**32)"), ("3,3", "3 is given twice")])
def test_bad_seeds_exit_2_before_training(capsys, monkeypatch, seeds, problem):
    monkeypatch.setattr(loss_parity, "train_once", None)  # any training would raise
    assert loss_parity.main(["--config", "gpt2-tiny", "--seeds", seeds]) == 2
    err = capsys.readouterr().err
    assert f"--seeds: {problem}" in err and len(err.strip().splitlines()) == 1


def test_seeds_with_a_seed_key_in_a_or_b_exit_2(capsys):
    assert loss_parity.main(["--config", "gpt2-tiny", "--seeds", "1,2", "--b", "accel=triton,seed=5"]) == 2
    assert "drop seed from --a, --b and --both" in capsys.readouterr().err
    assert loss_parity.main(["--config", "gpt2-tiny", "--seeds", "1,2", "--both", "seed=5"]) == 2


def fake_run(loss: float) -> dict:
    return {"keys": [], "losses": [loss + 1.0, loss], "final_val_loss": loss, "notes": []}


def test_a_failed_run_exits_1_and_keeps_the_finished_seeds(tmp_path, monkeypatch, capsys):
    done = iter([fake_run(3.0), fake_run(3.5), fake_run(2.0)])

    def train_once(config, keys, run_dir, device):
        if "seed=3" in keys and "accel=triton" in keys:
            raise loss_parity.RunFailed("the run with seed=3 exited 137: Killed")
        return next(done)

    monkeypatch.setattr(loss_parity, "train_once", train_once)
    monkeypatch.setenv("GPTFORGE_BENCH_OUT", str(tmp_path))
    assert loss_parity.main(["--config", "gpt2-tiny", "--seeds", "1,3", "--steps", "2", "--batch", "2"]) == 1
    err = capsys.readouterr().err
    assert "seed 3: training b (4/4)" in err and "exited 137: Killed" in err.strip().splitlines()[-1]
    report = json.loads((tmp_path / "loss_parity.json").read_text())
    assert report["complete"] is False and list(report["runs"]) == ["a@1", "b@1", "a@3"]
    assert [row["seed"] for row in report["seeds"]] == [1]
    assert report["seeds"][0]["val_diff"] == pytest.approx(0.5) and report["a_vs_b"]["max_abs"] == pytest.approx(0.5)
    assert report["seed_summary"]["n"] == 1 and report["seed_summary"]["drift"]["stderr"] is None


def test_max_drift_fails_the_seeds_whose_drift_is_above_it(tmp_path, monkeypatch, capsys):
    runs = iter([fake_run(3.0), fake_run(3.004), fake_run(3.0), fake_run(3.05)])  # seed 1 +0.004, seed 2 +0.05
    monkeypatch.setattr(loss_parity, "train_once", lambda config, keys, run_dir, device: next(runs))
    monkeypatch.setenv("GPTFORGE_BENCH_OUT", str(tmp_path))
    args = ["--config", "gpt2-tiny", "--seeds", "1,2", "--steps", "2", "--batch", "2", "--max-drift", "0.01"]
    assert loss_parity.main(args) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1] == "drift above --max-drift 0.01: seed 2 +0.05"
    assert loss_parity.drifts_over([{"seed": 1, "drift": -0.02}, {"seed": 2, "drift": 0.005}], 0.01) == [(1, -0.02)]


def test_max_drift_without_seeds_exits_2(capsys):
    assert loss_parity.main(["--config", "gpt2-tiny", "--max-drift", "0.01"]) == 2
    assert "give --seeds too" in capsys.readouterr().err


def test_seeds_pair_a_and_b_per_seed_on_the_data_both_runs_are_given_on_cpu(tmp_path, cli):
    sources = [tmp_path / f"doc{i}.txt" for i in range(40)]
    for i, path in enumerate(sources):
        path.write_text(f"def function_{i}(x):\n    return x * {i} + {i * i}\n" * 30)
    prefix = tmp_path / "code"
    made = cli("prepare", "--input", *map(str, sources), "--format", "text", "--tokenizer", "gpt2", "--append-eod",
               "--output-prefix", str(prefix))
    assert made.returncode == 0, made.stderr
    data = f"data-path={prefix}_text_document,tokenizer-type=gpt2"
    proc = run_script(tmp_path, "--steps", "3", "--batch", "2", "--seeds", "1,2", "--both", data)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "loss_parity.json").read_text())
    runs = report["runs"]
    assert list(runs) == ["a@1", "b@1", "a@2", "b@2"] and report["complete"] is True
    assert [row["seed"] for row in report["seeds"]] == [1, 2]
    assert runs["a@1"]["losses"] != runs["a@2"]["losses"]  # the seed reached the trainer
    assert report["a_vs_b"] == report["seeds"][0]["a_vs_b"]
    summary = report["seed_summary"]
    assert summary["n"] == 2 and summary["drift"]["stderr"] is not None and summary["a_spread"]["val"] > 0
    assert "seed 2: training b (4/4)" in proc.stderr
    assert "seed 2: a vs b max |diff|" in proc.stdout and "across 2 seeds: drift mean" in proc.stdout
    # every run got the data, and the report names it by content (for pooling) and says how often it was read
    assert report["common"][-2:] == data.split(",")
    digest = hashlib.sha256(Path(f"{prefix}_text_document.bin").read_bytes()).hexdigest()
    assert report["data"] == {"bin_sha256": {"code_text_document": digest}}
    # and the defaults the runs' own keys stood on (the config's values before any key)
    assert report["config_values"]["num-layers"] == 2 and report["config_values"]["accel"] == "triton"
    for run in runs.values():
        assert run["keys"][:len(report["common"])] == report["common"] and 0 < run["train_passes"]
        assert any(note["code"] == "data-repeats" for note in run["notes"]) is (run["train_passes"] > 1)
    assert "passes over the training split" in proc.stdout
    assert loss_parity.main(["--config", "gpt2-tiny", "--both", "no-such-key=1"]) == 2


def test_the_code_corpus_is_built_once_from_the_machines_own_source(tmp_path):
    from gptforge.data.indexed import IndexedDataset

    script = SCRIPT.parent / "code_corpus.sh"
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(script), str(tmp_path / "code")], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    made = json.loads((tmp_path / "code" / "prepare.json").read_text())
    files = (tmp_path / "code" / "files.txt").read_text().splitlines()
    assert files == sorted(files, key=os.fsencode) and any(f.endswith("/torch/nn/modules/linear.py") for f in files)
    dataset = IndexedDataset(str(tmp_path / "code" / "pycode_text_document"))
    assert made["documents"] == dataset.num_documents == len(files)
    assert made["tokens"] == int(dataset.sequence_lengths.sum()) > 8_200_000  # 500 steps of 16 x 1024 read it less than once
    keys = (tmp_path / "code" / "keys").read_text().strip()
    assert keys == f"data-path={tmp_path / 'code'}/pycode_text_document,tokenizer-type=gpt2"
    again = subprocess.run(["bash", str(script), str(tmp_path / "code")], capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0 and "already holds it" in again.stderr
