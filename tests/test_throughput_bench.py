"""bench/throughput.py: its command line, a whole dry run on the CPU, and nanoGPT's bench.py driven at our shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "throughput.py"
NANOGPT = Path(os.environ.get("GPTFORGE_NANOGPT_DIR", ROOT / "third_party" / "nanogpt"))
sys.path.insert(0, str(SCRIPT.parent))
import throughput  # noqa: E402
from conftest import pooled_parity  # noqa: E402

DRY = ["--device", "cpu", "--precision", "fp32", "--models", "gpt2-tiny", "--batch", "2", "--warmup", "1", "--steps", "2"]


def bench(*args: str, out: Path, timeout: float = 600):
    env = {**os.environ, "GPTFORGE_BENCH_OUT": str(out)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.parametrize("args, says", [
    (["--levers", "torch-loss,warp-drive"], "--levers: unknown lever 'warp-drive'"),
    (["--set", "accl=hopper"], "unknown config key 'accl'"),
    (["--set", "accel=fastest"], "accel: 'fastest' is not one of none, triton, hopper, te-fp8"),
    (["--models", "gpt2-9000m"], "no config file or packaged config named 'gpt2-9000m'"),
    (["--min-ratio", "0"], "--min-ratio: must be positive"),
    (["--steps", "0"], "--steps: must be positive"),
    (["--nanogpt", "."], "is not a nanoGPT checkout (no bench.py"),
])
def test_bad_arguments_exit_2_with_one_line_and_nothing_written(tmp_path, monkeypatch, capsys, args, says):
    monkeypatch.setenv("GPTFORGE_BENCH_OUT", str(tmp_path / "out"))
    assert throughput.main([*DRY, *args]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_levers_expand_against_the_batch_and_default_to_all():
    plan = throughput.parse_args(["--models", "gpt2-124m"])
    assert [lv.name for lv in plan.levers] == list(throughput.DEFAULT_LEVERS)
    assert set(throughput.DEFAULT_LEVERS) == set(throughput.LEVERS)
    assert throughput.expand(throughput.LEVERS["accum-2"].overrides, 32) == ["micro-batch-size=16"]
    assert throughput.expand(throughput.LEVERS["micro-2x"].overrides, 32) == ["micro-batch-size=64", "global-batch-size=64"]
    assert all(lv.prediction for lv in throughput.LEVERS.values())
    assert throughput.parse_args(["--levers", "none"]).levers == []


def test_cpu_dry_run_measures_baseline_and_levers_and_writes_json(tmp_path):
    proc = bench(*DRY, "--levers", "torch-loss,eager,te-fp8", "--profile", out=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "throughput.json").read_text())
    base = data["comparison"][0]["gptforge"]
    assert base["tokens_per_s"] > 0 and base["steps"] == 2 and base["graph_breaks"] == 0
    assert 0 < base["step_ms_median"] <= base["step_ms_max"]
    assert set(base["gc_collections"]) == {"gen0", "gen1", "gen2"}
    assert data["comparison"][0]["nanogpt"] is None  # no --nanogpt
    levers = {row["lever"]: row for row in data["levers"]}
    assert levers["torch-loss"]["overrides"] == ["accel=none"]
    assert levers["torch-loss"]["result"]["speedup"] > 0 and levers["eager"]["result"]["speedup"] > 0
    assert "foreach" in {note["code"]: note["message"] for note in levers["eager"]["result"]["notes"]}["optimizer"]
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        assert "not importable" in levers["te-fp8"]["result"]["failed"]
    assert "predicted:" in proc.stdout and "measured:" in proc.stdout
    assert "aten::" in (tmp_path / "profile-gpt2-tiny.txt").read_text()


def test_min_ratio_without_a_nanogpt_figure_fails(tmp_path):
    proc = bench(*DRY, "--levers", "none", "--min-ratio", "1.3", out=tmp_path)
    assert proc.returncode == 1
    assert "below --min-ratio 1.3: gpt2-tiny: not measured" in proc.stdout
    assert json.loads((tmp_path / "throughput.json").read_text())["pass"] is False


# nanoGPT is the benchmark's reference, not a dependency: its unmodified bench.py runs where you cloned it
@pytest.mark.skipif(not (NANOGPT / "bench.py").is_file(), reason="no nanoGPT checkout (set GPTFORGE_NANOGPT_DIR)")
def test_nanogpt_bench_runs_unmodified_at_our_shape_and_min_ratio_decides(tmp_path):
    before = {p.name: p.read_bytes() for p in NANOGPT.iterdir() if p.is_file()}
    proc = bench(*DRY, "--levers", "none", "--nanogpt", str(NANOGPT), "--min-ratio", "1000", out=tmp_path)
    row = json.loads((tmp_path / "throughput.json").read_text())["comparison"][0]
    theirs = row["nanogpt"]
    assert "failed" not in theirs, theirs
    assert theirs["steps"] == 20 and theirs["tokens_per_s"] > 0
    assert "--block_size=64" in theirs["command"] and "--batch_size=2" in theirs["command"]
    assert row["ratio"] == pytest.approx(row["gptforge"]["tokens_per_s"] / theirs["tokens_per_s"])
    assert proc.returncode == 1 and "below --min-ratio 1000" in proc.stdout
    assert {p.name: p.read_bytes() for p in NANOGPT.iterdir() if p.is_file()} == before  # nothing written there



def test_the_committed_runs_give_the_figures_benchmarks_quotes():
    results = ROOT / "bench" / "results" / "throughput"

    def comparison(name: str) -> dict:
        report = json.loads((results / f"{name}.json").read_text())
        return {row["model"]: row for row in report["comparison"]}, report["levers"]

    defaults, levers = comparison("run63-defaults-bf16-residual")
    small = defaults["gpt2-124m"]
    assert (round(small["gptforge"]["tokens_per_s"]), round(small["ratio"], 3)) == (522065, 1.143)
    assert "residual stream: bf16 (weights, LayerNorm statistics and weight gradients float32)" in small["gptforge"]["notes"]
    assert round(defaults["gpt2-350m"]["ratio"], 3) == 1.089 and round(defaults["gpt2-350m"]["gptforge"]["mfu"], 3) == 0.49
    assert levers[0]["overrides"] == ["bf16-residual=false"] and round(levers[0]["result"]["speedup"] - 1, 3) == -0.051
    fastest, _ = comparison("run60-fastest")
    assert (round(fastest["gpt2-124m"]["gptforge"]["tokens_per_s"]), round(fastest["gpt2-124m"]["ratio"], 3)) == (601881, 1.289)
    assert round(fastest["gpt2-350m"]["gptforge"]["mfu"], 3) == 0.552
    again, _ = comparison("run65-defaults")
    assert round(again["gpt2-124m"]["ratio"], 3) == 1.143
    ratios = [comparison(name)[0]["gpt2-124m"]["ratio"]
              for name in ("run48-fastest-combo", "run49-fastest", "run60-fastest", "run66-fastest-1", "run66-fastest-2",
                           "run67-fastest-clocks-logged")]
    assert (round(min(ratios), 3), round(max(ratios), 3), round(sum(ratios) / len(ratios), 3)) == (1.289, 1.312, 1.301)
    as_configured = [comparison(name)[0] for name in ("run76-default-config-1", "run76-default-config-2", "run77-default-config",
                                                       "run80-default-config-1", "run80-default-config-2", "run80-default-config-3",
                                                       "run85-default-config-1", "run85-default-config-2",
                                                       "run92-default-config-1", "run92-default-config-2")]
    for rows in as_configured:  # the GPT-2 config as it trains (hopper-kernels=auto) turned every Hopper key on
        assert rows["gpt2-124m"]["gptforge"]["notes"][0].startswith("hopper-kernels=auto: attention-backend=cudnn-flash4")
    ratios += [rows["gpt2-124m"]["ratio"] for rows in as_configured]
    assert [round(r, 3) for r in ratios[-10:]] == [1.309, 1.31, 1.326, 1.291, 1.3, 1.296, 1.314, 1.313, 1.31, 1.302]
    assert round(sum(ratios[-10:]) / 10, 3) == 1.307
    assert (round(min(ratios), 3), round(max(ratios), 3), round(sum(ratios) / len(ratios), 3)) == (1.289, 1.326, 1.305)
    assert round(max(rows["gpt2-124m"]["gptforge"]["tokens_per_s"] for rows in as_configured)) == 601935
    assert round(as_configured[2]["gpt2-350m"]["ratio"], 3) == 1.212 and round(as_configured[2]["gpt2-350m"]["gptforge"]["mfu"], 3) == 0.546


def test_the_committed_runs_since_bf16_weights_give_the_figures_benchmarks_quotes():
    results = ROOT / "bench" / "results"

    def report(name: str) -> dict:
        return json.loads((results / "throughput" / f"{name}.json").read_text())

    def ratio(row: dict) -> float:
        return round(row["ratio"], 3)

    names = ("run106-nanogpt", "run107-nanogpt", "run108-norm-split", "run110-norm-split", "run112-nanogpt")
    rows = [report(name)["comparison"][0] for name in names]
    assert [ratio(row) for row in rows] == [1.312, 1.318, 1.319, 1.318, 1.321]
    assert round(max(row["gptforge"]["tokens_per_s"] for row in rows)) == 606402
    assert [round(row["nanogpt"]["tokens_per_s"]) for row in rows][2:] == [450691, 453371, 457774]
    assert rows[-1]["gptforge"]["notes"][0].endswith("compile-mode=reduce-overhead compile-norm-rows=128")
    assert round(rows[-1]["gptforge"]["tokens_per_s"]) == 604794 and round(rows[-1]["gptforge"]["mfu"], 3) == 0.523
    levers = [(lever["result"], row) for name, row in zip(names, rows) for lever in report(name)["levers"]
              if lever["lever"] == "norm-split-128"]
    assert [round(result["speedup"] - 1, 3) for result, _ in levers] == [0.01, 0.004, 0.003]
    assert [round(result["tokens_per_s"] / row["nanogpt"]["tokens_per_s"], 3) for result, row in levers] == [1.332, 1.324, 1.322]
    (weights,) = report("run109-350m-bf16-weights")["levers"]
    assert round(weights["result"]["speedup"] - 1, 3) == 0.015
    (rows350,) = report("run111-350m-norm-split")["levers"]
    assert (round(rows350["result"]["tokens_per_s"]), round(rows350["result"]["mfu"], 3)) == (225525, 0.553)
    parity = json.loads((results / "loss_parity" / "norm-rows" / "run112-norm-rows-seeds5-6.json").read_text())
    drift = parity["seed_summary"]["drift"]
    assert (round(drift["mean"], 4), round(drift["stderr"], 4)) == (-0.0018, 0.0016)
    assert [round(seed["val_diff"], 3) for seed in parity["seeds"]] == [0.032, -0.021]


def test_the_committed_runs_of_the_tied_scatter_give_the_figures_benchmarks_quotes():
    results = ROOT / "bench" / "results"

    def report(name: str) -> dict:
        return json.loads((results / "throughput" / f"{name}.json").read_text())

    before, = report("run114-levers")["comparison"]
    assert (round(before["gptforge"]["tokens_per_s"]), round(before["ratio"], 3)) == (612264, 1.331)
    speedups = {lever["lever"]: round(lever["result"]["speedup"] - 1, 3) for lever in report("run114-levers")["levers"]}
    assert speedups == {"tied-scatter": 0.009, "coordinate-descent": 0.008}
    with_key = [report(name)["comparison"][0] for name in ("run115-tied-scatter-nanogpt", "run118-tied-scatter-nanogpt")]
    assert [round(row["gptforge"]["tokens_per_s"]) for row in with_key] == [616698, 610818]
    assert [round(row["ratio"], 3) for row in with_key] == [1.349, 1.321]
    assert all(row["gptforge"]["tokens_per_s"] >= 610_000 for row in with_key)
    assert all("the embedding's gradient scattered into the output layer's" in row["gptforge"]["notes"][-1]
               for row in with_key)
    (lever,) = report("run118-tied-scatter-lever")["levers"]
    assert round(lever["result"]["speedup"] - 1, 3) == 0.002
    as_it_trains, = report("run120-nanogpt")["comparison"]  # the key in the Hopper set: hopper-kernels=auto names it
    assert as_it_trains["gptforge"]["notes"][0].endswith("compile-norm-rows=128 compile-tied-scatter=true")
    assert (round(as_it_trains["gptforge"]["tokens_per_s"]), round(as_it_trains["ratio"], 3)) == (600455, 1.316)
    large, = report("run119-350m-tied-scatter")["comparison"]
    assert (round(large["gptforge"]["tokens_per_s"]), round(large["gptforge"]["mfu"], 3)) == (230735, 0.566)


def test_the_tied_scatters_loss_parity_pools_to_what_benchmarks_quotes():
    pooled = pooled_parity("tied-scatter", "compile-tied-scatter=false")["configs"]["compile-tied-scatter=true"]
    assert pooled["runs"] == 8
    assert (round(pooled["mean"], 4), round(pooled["stderr"], 4), round(pooled["rms"], 4)) == (0.0065, 0.0048, 0.0141)
    assert (round(pooled["val_diff"]["mean"], 4), round(pooled["val_diff"]["stderr"], 4)) == (0.0057, 0.0082)
