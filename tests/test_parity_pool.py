"""bench/parity_pool.py: drifts against the A runs of every call, pooled per seed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "parity_pool.py"
RESULTS = sorted((ROOT / "bench" / "results" / "loss_parity").glob("*.json"))
COMMON = ["train-iters=4", "keep-last=1"]


def report(path: Path, runs: dict, steps: int = 4, common: list[str] = COMMON, data: dict | None = None,
           values: dict | None = None) -> Path:
    """A loss_parity.py report with RUNS: name -> (own keys, losses); VALUES: its config's values (None: not recorded)."""
    body = {"config": "gpt2-124m", "steps": steps, "batch": 16, "common": common, "data": data, "config_values": values,
            "runs": {name: {"keys": common + ["data-cache-dir=/tmp/x/data", *keys], "losses": losses,
                            "final_val_loss": 5.0, "notes": []} for name, (keys, losses) in runs.items()}}
    path.write_text(json.dumps(body))
    return path


def pool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_each_run_is_read_against_the_mean_of_its_seeds_a_runs_from_every_file(tmp_path):
    first = report(tmp_path / "one.json", {
        "a@1": (["fused-loss=true", "seed=1"], [9, 9, 3.0, 3.0]),
        "b@1": (["fused-loss=true", "x=1", "seed=1"], [9, 9, 3.5, 3.5]),
        "a@2": (["fused-loss=true", "seed=2"], [9, 9, 2.0, 2.0]),
    })
    second = report(tmp_path / "two.json", {
        "a@1": (["fused-loss=true", "seed=1"], [9, 9, 3.2, 3.2]),
        "b@2": (["fused-loss=true", "x=1", "seed=2"], [9, 9, 1.0, 1.0]),
    })
    proc = pool("--a", "fused-loss=true", "--json", first, second)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["seeds"]["1"] == {"a_runs": 2, "a_mean": pytest.approx(3.1), "a_spread": pytest.approx(0.2), "a_val_mean": 5.0}
    rows = {(Path(r["file"]).name, r["name"]): r for r in result["runs"]}
    assert rows[("one.json", "b@1")]["drift"] == pytest.approx(0.4)  # against 3.1, the pooled mean
    assert rows[("one.json", "b@1")]["drift_own_a"] == pytest.approx(0.5)  # against its own call's 3.0
    assert rows[("two.json", "b@2")]["drift"] == pytest.approx(-1.0)
    assert rows[("two.json", "b@2")]["drift_own_a"] is None  # no A of seed 2 in its own call
    summary = result["configs"]["fused-loss=true x=1"]
    assert summary["runs"] == 2 and summary["mean"] == pytest.approx(-0.3) and summary["stderr"] == pytest.approx(0.7)


def test_a_reruns_give_the_run_to_run_deviation_and_each_configuration_its_rms_drift(tmp_path):
    one = report(tmp_path / "one.json", {
        "a@1": (["fused-loss=true", "seed=1"], [9, 9, 3.0, 3.0]),
        "a2@1": (["fused-loss=true", "seed=1"], [9, 9, 3.2, 3.2]),
        "a@2": (["fused-loss=true", "seed=2"], [9, 9, 2.0, 2.0]),
        "b@1": (["fused-loss=true", "x=1", "seed=1"], [9, 9, 3.4, 3.4]),
        "b@2": (["fused-loss=true", "x=1", "seed=2"], [9, 9, 1.7, 1.7]),
    })
    two = report(tmp_path / "two.json", {"a@2": (["fused-loss=true", "seed=2"], [9, 9, 2.4, 2.4])})
    proc = pool("--json", one, two)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    # seed 1: 3.0, 3.2 around 3.1; seed 2: 2.0, 2.4 around 2.2; (0.01 + 0.01 + 0.04 + 0.04) / 2 degrees of freedom
    assert result["noise"] == {"sd": pytest.approx(0.05 ** 0.5), "dof": 2}
    summary = result["configs"]["fused-loss=true x=1"]  # drifts +0.3 and -0.5
    assert summary["rms"] == pytest.approx(((0.09 + 0.25) / 2) ** 0.5)
    shown = pool(one, two).stdout
    assert "run-to-run standard deviation within a seed: 0.2236 (2 degrees of freedom)" in shown
    single = json.loads(pool("--json", two).stdout)
    assert single["noise"] == {"sd": None, "dof": 0}


def test_versus_reads_each_configuration_against_another_with_the_combined_error(tmp_path):
    runs = {"a@1": (["fused-loss=true", "seed=1"], [9, 9, 3.0, 3.0]), "a@2": (["fused-loss=true", "seed=2"], [9, 9, 2.0, 2.0])}
    for seed, base in ((1, 3.0), (2, 2.0)):
        runs[f"p@{seed}"] = (["fused-loss=true", "p=1", f"seed={seed}"], [9, 9, base + 0.1 * seed, base + 0.1 * seed])
        runs[f"q@{seed}"] = (["fused-loss=true", "p=1", "q=1", f"seed={seed}"], [9, 9, base + 0.4 * seed, base + 0.4 * seed])
    report(tmp_path / "r.json", runs)
    proc = pool("--a", "fused-loss=true", "--versus", "fused-loss=true,p=1", "--json", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    versus = json.loads(proc.stdout)["versus"]
    assert versus["config"] == ["fused-loss=true", "p=1"] and list(versus["differences"]) == ["fused-loss=true p=1 q=1"]
    diff = versus["differences"]["fused-loss=true p=1 q=1"]
    assert diff["difference"] == pytest.approx(0.45)  # drifts 0.4, 0.8 against 0.1, 0.2
    assert diff["stderr"] == pytest.approx((0.2 ** 2 + 0.05 ** 2) ** 0.5)  # s.e. 0.2 and 0.05 combined
    missing = pool("--a", "fused-loss=true", "--versus", "x=1", tmp_path / "r.json")
    assert missing.returncode == 2 and "--versus x=1: no pooled run has exactly these own keys" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_files_of_different_shapes_are_refused_in_one_line(tmp_path):
    first = report(tmp_path / "one.json", {"a@1": (["fused-loss=true", "seed=1"], [1.0] * 4)})
    second = report(tmp_path / "two.json", {"a@1": (["fused-loss=true", "seed=1"], [1.0] * 6)}, steps=6)
    proc = pool(first, second)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "6 steps of batch 16, where the first file has gpt2-124m, 4 steps" in proc.stderr


def test_files_whose_runs_share_other_keys_are_refused_in_one_line(tmp_path):
    first = report(tmp_path / "one.json", {"a@1": (["fused-loss=true", "seed=1"], [1.0] * 4)})
    second = report(tmp_path / "two.json", {"a@1": (["fused-loss=true", "seed=1"], [1.0] * 4)},
                    common=COMMON + ["data-path=code_text_document"])
    proc = pool(first, second)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "share other keys than the first file's (data-path=code_text_document)" in proc.stderr


def test_reports_made_on_other_config_defaults_are_refused_in_one_line(tmp_path):
    runs = {"a@1": (["fused-loss=true", "seed=1"], [1.0] * 4)}
    old = {"lr": 6e-4, "bf16-residual": False}
    first = report(tmp_path / "one.json", runs, values=old)
    same = report(tmp_path / "two.json", runs, values=dict(old))
    new = report(tmp_path / "three.json", runs, values={**old, "bf16-residual": True})
    unrecorded = report(tmp_path / "four.json", runs)
    assert pool(first, same).returncode == 0
    proc = pool(first, new)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "its config's defaults differ from the first file's (bf16-residual false -> true)" in proc.stderr
    assert "made before reports recorded" in pool(unrecorded, first).stderr


def test_the_same_corpus_built_in_two_directories_pools_and_another_corpus_does_not(tmp_path):
    def made(name: str, where: str, digest: str) -> Path:
        return report(tmp_path / name, {"a@1": (["fused-loss=true", "seed=1"], [1.0] * 4)},
                      common=COMMON + [f"data-path={where}/code_text_document"],
                      data={"bin_sha256": {"code_text_document": digest}})

    first, moved, other = made("one.json", "/tmp/a", "ab" * 32), made("two.json", "/tmp/b", "ab" * 32), made("three.json", "/tmp/a", "cd" * 32)
    together = pool("--json", first, moved)
    assert together.returncode == 0, together.stderr
    assert json.loads(together.stdout)["seeds"]["1"]["a_runs"] == 2
    refused = pool(first, other)
    assert refused.returncode == 2 and f"data code_text_document sha256={'cd' * 32}" in refused.stderr


@pytest.mark.parametrize("text, says", [
    ("not json", "not a loss_parity.py report (JSONDecodeError"),
    ('{"runs": {}}', "not a loss_parity.py report (KeyError"),
    ('{"config": "c", "steps": 4, "batch": 1, "common": [], "runs": {"a": {"keys": []}}}', "(KeyError: 'losses')"),
])
def test_a_file_that_is_not_a_report_is_refused_in_one_line(tmp_path, text, says):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    proc = pool(bad)
    assert proc.returncode == 2 and says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_nothing_to_pool_as_a_says_so(tmp_path):
    only_b = report(tmp_path / "b.json", {"b@1": (["fused-loss=true", "x=1", "seed=1"], [1.0] * 4)})
    proc = pool("--a", "fused-loss=true", only_b)
    assert proc.returncode == 2 and "no run's own keys are exactly --a fused-loss=true" in proc.stderr


def test_the_committed_runs_give_the_figures_benchmarks_quotes():
    proc = pool("--a", "fused-loss=true", "--json", *RESULTS)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    drift = {(Path(r["file"]).stem, r["name"]): round(r["drift"], 4) for r in result["runs"]}
    assert drift[("run27-parity-set", "b@1337")] == -0.0093
    assert drift[("run37-loss-epilogue-mlp", "b@1337")] == 0.0297
    assert (drift[("run39-loss-epilogue-mlp-twice", "a@1337")], drift[("run39-loss-epilogue-mlp-twice", "b@1337")]) == \
        (0.0236, -0.0221)
    assert (drift[("run42-parity-set-twice-cudnn-flash4-seed1337", "a@1337")],
            drift[("run42-parity-set-twice-cudnn-flash4-seed1337", "a2@1337")]) == (-0.0042, -0.0115)
    assert drift[("run50-fastest-seed1234", "b@1234")] == -0.0144
    summary = {c.replace("fused-loss=true attention-backend=", "").replace(PARITY_REST, "P"): (s["runs"], round(s["mean"], 4),
                                                                                              round(s["stderr"], 4) if s["stderr"] else None)
               for c, s in result["configs"].items()}
    assert summary == {"flash4 P": (5, -0.0063, 0.0017), "flash4 P loss-epilogue=true": (10, -0.0049, 0.0057),
                       "cudnn-flash4 P": (5, -0.0097, 0.0032), "cudnn-flash4 P loss-epilogue=true": (3, -0.0088, 0.0007),
                       "cudnn-flash4 P loss-epilogue=true qkv-bias-gemm=true": (1, -0.0144, None)}
    assert {s: round(v["a_spread"], 4) for s, v in result["seeds"].items()} == {"1234": 0.0027, "1337": 0.0096, "2": 0.0074}


def test_the_committed_runs_read_against_the_parity_set_give_what_benchmarks_quotes():
    proc = pool("--a", "fused-loss=true", "--versus", f"fused-loss=true,attention-backend=flash4,{PARITY_REST.replace(' ', ',')}",
                "--json", *RESULTS)
    assert proc.returncode == 0, proc.stderr
    moved = {c.replace("fused-loss=true attention-backend=", "").replace(PARITY_REST, "P"): (round(d["difference"], 4), d["stderr"] and round(d["stderr"], 4))
             for c, d in json.loads(proc.stdout)["versus"]["differences"].items()}
    assert moved["cudnn-flash4 P"] == (-0.0034, 0.0036)
    assert moved["cudnn-flash4 P loss-epilogue=true"] == (-0.0024, 0.0019)
    assert moved["flash4 P loss-epilogue=true"] == (0.0014, 0.006)


PARITY_REST = "gelu-epilogue=true bf16-residual=true compile-mode=reduce-overhead"


def test_the_committed_code_corpus_runs_give_the_figures_benchmarks_quotes():
    files = sorted((ROOT / "bench" / "results" / "loss_parity" / "code-corpus").glob("run*.json"))
    proc = pool("--a", "fused-loss=true", "--json", *files)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert len(files) == 8 and result["noise"]["dof"] == 7 and round(result["noise"]["sd"], 4) == 0.0126
    s = result["configs"][f"fused-loss=true attention-backend=cudnn-flash4 {PARITY_REST} loss-epilogue=true qkv-bias-gemm=true"]
    assert (s["runs"], round(s["mean"], 4), round(s["stderr"], 4), round(s["rms"], 4)) == (9, 0.0079, 0.0093, 0.0274)
    assert (round(s["val_diff"]["mean"], 4), round(s["val_diff"]["stderr"], 4)) == (0.01, 0.0107)
    alone = result["configs"]["fused-loss=true bf16-residual=true"]  # the GPT-2 configs' default since
    assert (alone["runs"], round(alone["mean"], 4), round(alone["stderr"], 4), round(alone["rms"], 4)) == (16, 0.0017, 0.0039, 0.0153)
    assert (round(alone["val_diff"]["mean"], 4), round(alone["val_diff"]["stderr"], 4)) == (0.0014, 0.006)
    only_b = [r for r in result["runs"] if "run59" in r["file"]]  # trained without A, read against runs 54-57's
    assert len(only_b) == 8 and all(r["drift_own_a"] is None and r["drift"] is not None for r in only_b)
