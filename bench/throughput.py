#!/usr/bin/env python
"""GPT-2 training throughput: gptforge's training step against karpathy/nanoGPT's bench.py, same GPU run.

For each model (default GPT-2 124M and 350M; seq from the config, bf16 autocast, one optimizer step per
batch of --batch): gptforge's trainer steps (Trainer.setup, then --steps steps as the training loop
runs them, step N+1 queued before step N's loss is read, and --steps more reading each loss at once as
bench.py does: the model, loss, backward, clipping, AdamW; no eval, no checkpoint) on synthetic tokens,
and nanoGPT's own bench.py (--real_data=False) at the same shape, precision and batch. Prints tokens/s, ms/step, MFU (PaLM
appendix B, 6N + 12·L·H·Q·T, against the dense bf16 peak in configs/gpu_peaks.toml), peak memory and
the ratio gptforge / nanoGPT. Then each lever of --levers, one at a time, on --lever-model: the
baseline plus that lever's config keys, against the baseline, with the prediction made before
measuring. Each measurement runs in its own process (a crash or out-of-memory there is reported, not
fatal); all of it stops at --budget-s, skipping what is left. JSON goes to
$GPTFORGE_BENCH_OUT/throughput.json (or ./throughput.json), rewritten after every row.

    PYTHONPATH=src python3 bench/throughput.py --nanogpt third_party/nanoGPT --min-ratio 1.0
    PYTHONPATH=src python3 bench/throughput.py --nanogpt DIR --models gpt2-124m-hopper,gpt2-350m --set accel=hopper --levers none
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nanogpt_bench  # noqa: E402

GPT2_VOCAB = 50257
RESULT_TAG = "RESULT "


@dataclass(frozen=True)
class Lever:
    name: str
    overrides: tuple[str, ...]
    prediction: str  # written before any measurement; the table shows it next to the result
    needs: str = ""  # a module that must import, else the lever is skipped
    env: tuple[str, ...] = ()  # NAME=VALUE set in the measuring process (torch's own knobs)


# Predictions for GPT-2 124M, batch 32 x 1024, bf16, torch.compile, one H100 SXM. The levers measured and removed
# are in bench/results/levers-removed.md; BENCHMARKS.md holds every lever's result.
LEVERS = {lv.name: lv for lv in (
    Lever("torch-loss", ("accel=none",),
          "-7-9% against accel=triton: the fused loss's softmax and gradient as torch ops instead of the Triton kernel"),
    Lever("hopper", ("accel=hopper",),
          "+13-16% against accel=triton: cuDNN + FA4 attention, quack's GEMM epilogues in the MLP and the loss, the qkv "
          "bias gradient from its GEMM, CUDA graphs", "flash_attn.cute.interface"),
    Lever("te-fp8", ("accel=te-fp8",),
          "-40-50%: TE's layers break the compiled graph into pieces, and at width 768 the FP8 casts cost about what "
          "the faster GEMMs save", "transformer_engine.pytorch"),
    Lever("accum-2", ("micro-batch-size={half}",),
          "-2-5%: two half-size micro batches per step, smaller GEMMs, same optimizer work"),
    Lever("micro-2x", ("micro-batch-size={double}", "global-batch-size={double}"),
          "+0-2%: the optimizer step is amortised over twice the tokens; more memory"),
    Lever("eager", ("compile=false",),
          "-25-35%: no fusion of LayerNorm/GELU/residual/softmax-loss"),
)}
DEFAULT_LEVERS = tuple(LEVERS)


class Usage(Exception):
    """A bad command line: one line on stderr, exit 2."""


@dataclass
class Plan:
    models: list[str]
    batch: int
    precision: str
    device: str
    sets: list[str]
    levers: list[Lever]
    lever_model: str
    nanogpt: Path | None
    nanogpt_bias: bool
    warmup: int
    steps: int
    budget_s: float
    min_ratio: float | None
    profile: bool
    out: Path
    rows: dict = field(default_factory=lambda: {"comparison": [], "levers": []})


# ---- one gptforge measurement (child process) ----------------------------------------------------------

def base_overrides(batch: int, precision: str, warmup: int, steps: int) -> list[str]:
    return [f"micro-batch-size={batch}", f"global-batch-size={batch}", f"train-iters={warmup + 2 * steps}",
            f"lr-warmup-iters={max(1, min(10, warmup))}", "eval-interval=1000000", "save-interval=1000000",
            "log-interval=1000000", f"precision={precision}"]


def expand(overrides, batch: int) -> list[str]:
    return [o.format(half=max(1, batch // 2), double=2 * batch) for o in overrides]


def measure_gptforge(spec: dict) -> dict:
    """Time spec['steps'] trainer steps after spec['warmup'] on synthetic GPT-2-vocabulary tokens."""
    import torch
    from rich.console import Console

    from train_gpt2_bench import RandomTokens
    from gptforge.train import distributed
    from gptforge.train.config import load_config
    from gptforge.train.data import DataSetup, TokenizerSpec
    from gptforge.train.loop import RunOptions, Trainer

    cfg, _ = load_config(spec["config"], spec["overrides"])
    rows = (spec["warmup"] + 2 * spec["steps"] + 4) * cfg.global_batch_size  # + the profiled steps
    data = DataSetup(RandomTokens(rows, cfg.seq_length, GPT2_VOCAB, 0), RandomTokens(cfg.micro_batch_size, cfg.seq_length, GPT2_VOCAB, 1),
                     TokenizerSpec("gpt2"), GPT2_VOCAB, "synthetic GPT-2-vocabulary tokens")
    trainer = Trainer(cfg, RunOptions(run_dir=Path(spec["run_dir"]), config_name=spec["config"], device=spec["device"]),
                      data=data, console=Console(quiet=True))
    trainer.preflight()
    trainer.setup()
    cuda = trainer.device.type == "cuda"
    try:
        for _ in range(spec["warmup"]):
            trainer.train_step()
        t0 = time.perf_counter()
        for _ in range(spec["steps"]):
            trainer.train_step()  # reads the loss at once: a host sync every step, as nanoGPT's bench.py
        synced_seconds = time.perf_counter() - t0
        step_ms = []
        with CollectorWatch() as collections:
            t0 = time.perf_counter()
            for last in trainer.steps(trainer.step + spec["steps"]):  # the training loop's own way: one step queued ahead
                step_ms.append(last["step_ms"])
            seconds = time.perf_counter() - t0
        profile = profile_steps(trainer, spec["profile"]) if spec.get("profile") else None
    finally:
        trainer.metrics.close()
        distributed.shutdown(trainer.env)
    tok_s = spec["steps"] * cfg.global_batch_size * cfg.seq_length / seconds
    from torch._dynamo.utils import counters

    from gptforge.train.peaks import mfu

    synced_tok_s = spec["steps"] * cfg.global_batch_size * cfg.seq_length / synced_seconds
    return {"tokens_per_s": tok_s, "ms_per_step": 1e3 * seconds / spec["steps"], "steps": spec["steps"],
            "tokens_per_s_synced": synced_tok_s, "ms_per_step_synced": 1e3 * synced_seconds / spec["steps"],
            "warmup": spec["warmup"], "mfu": mfu(trainer.flops_per_token, tok_s, trainer.peak),
            "step_ms_median": statistics.median(step_ms), "step_ms_max": max(step_ms),
            "gc_collections": collections.summary(),
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "final_loss": last["loss"], "flops_per_token": trainer.flops_per_token, "notes": [note.to_json() for note in trainer.notes],
            "graph_breaks": sum(counters["graph_break"].values()),
            "graph_break_reasons": sorted(counters["graph_break"], key=counters["graph_break"].get)[-3:],
            "device_name": trainer.peak.device_name, "peak_tflops": (trainer.peak.bf16_flops or 0) / 1e12,
            "torch": torch.__version__, "profile": profile}


class CollectorWatch:
    """Python's garbage collections while it is open: count and host milliseconds per generation."""

    def __enter__(self) -> CollectorWatch:
        self.started: float | None = None
        self.seen = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
        gc.callbacks.append(self.on_collection)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self.on_collection)

    def on_collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        elif self.started is not None:
            counts = self.seen[info["generation"]]
            counts[0] += 1
            counts[1] += 1e3 * (time.perf_counter() - self.started)
            self.started = None

    def summary(self) -> dict:
        return {f"gen{g}": {"count": n, "ms": round(ms, 2)} for g, (n, ms) in self.seen.items()}


def profile_steps(trainer, path: str, steps: int = 3) -> dict:
    """The kernels of a few more steps, by device time, as a text table at PATH; the GPU's busy and idle time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if trainer.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in trainer.steps(trainer.step + steps):
            pass
    key = "self_cuda_time_total" if trainer.device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=90)
    gaps = gpu_gaps(prof.events(), steps)
    Path(path).write_text(table + "\n" + json.dumps(gaps, indent=1) + "\n")
    return {"path": path, **gaps}


def gpu_gaps(events, steps: int) -> dict:
    """Busy and idle GPU time per step (union of kernel intervals), and the longest idle gaps with the kernel before each."""
    from torch.autograd import DeviceType

    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type == DeviceType.CUDA)
    if not kernels:
        return {}
    busy, gaps, end = 0.0, [], kernels[0][0]
    before = ""
    for start, stop, name in kernels:
        if start > end:
            gaps.append((start - end, before))
        busy += max(0.0, stop - max(start, end))
        if stop > end:
            end, before = stop, name
    window = end - kernels[0][0]
    top = sorted(gaps, reverse=True)[:8]
    return {"gpu_busy_ms_per_step": busy / 1e3 / steps, "gpu_idle_ms_per_step": (window - busy) / 1e3 / steps,
            "longest_gaps_us": [[round(g, 1), name[:80]] for g, name in top]}


def child_main(spec_json: str) -> int:
    spec = json.loads(spec_json)
    try:
        result = measure_gptforge(spec)
    except Exception as err:  # reported by the parent as this row's failure
        print(RESULT_TAG + json.dumps({"failed": f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"}))
        raise
    print(RESULT_TAG + json.dumps(result))
    return 0


# ---- the parent: plan, run, report -----------------------------------------------------------------------

def run_child(spec: dict, timeout: float, env: tuple[str, ...] = ()) -> dict:
    child_env = {**os.environ, **dict(e.split("=", 1) for e in env)}
    try:
        proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)], capture_output=True,
                              text=True, timeout=timeout, env=child_env)
    except subprocess.TimeoutExpired:
        return {"failed": f"ran past {timeout:.0f} s (time budget)"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if lines:
        return json.loads(lines[-1][len(RESULT_TAG):])
    tail = proc.stderr.strip().splitlines()[-2:]
    return {"failed": f"exit {proc.returncode}: " + " | ".join(tail)}


def model_shape(config: str, sets: list[str]) -> tuple[dict, bool]:
    """The GPT-2 shape for nanoGPT, and whether gptforge compiles (nanoGPT then does too)."""
    from gptforge.train.config import load_config

    cfg, _ = load_config(config, sets)
    shape = {"layers": cfg.num_layers, "heads": cfg.num_attention_heads, "width": cfg.hidden_size, "seq": cfg.seq_length}
    return shape, cfg.compile


class Runner:
    def __init__(self, plan: Plan):
        self.plan, self.t0 = plan, time.monotonic()
        self.work = Path(tempfile.mkdtemp(prefix="gptforge-throughput-"))
        self.count = 0

    def left(self) -> float:
        return self.plan.budget_s - (time.monotonic() - self.t0)

    def gptforge(self, config: str, extra: list[str], profile: str | None = None, env: tuple[str, ...] = ()) -> dict:
        p = self.plan
        if self.left() < 20:
            return {"failed": "skipped: time budget spent"}
        self.count += 1
        spec = {"config": config, "overrides": base_overrides(p.batch, p.precision, p.warmup, p.steps) + p.sets + extra,
                "warmup": p.warmup, "steps": p.steps, "device": p.device, "run_dir": str(self.work / f"run{self.count}"),
                "profile": str(p.out / f"profile-{Path(config).stem}{profile}.txt") if profile is not None else None}
        return run_child(spec, self.left(), env)

    def nanogpt(self, config: str) -> dict:
        p = self.plan
        if self.left() < 20:
            return {"failed": "skipped: time budget spent"}
        shape, compile_ = model_shape(config, p.sets)
        return nanogpt_bench.run(p.nanogpt, shape, p.batch, p.device, p.precision, compile_, p.nanogpt_bias,
                                 self.left(), self.work)


def with_mfu(row: dict, flops_per_token: float | None, peak_tflops: float | None) -> dict:
    if "failed" not in row and "mfu" not in row:
        row["mfu"] = flops_per_token * row["tokens_per_s"] / (peak_tflops * 1e12) if flops_per_token and peak_tflops else None
    return row


def compare(runner: Runner, config: str, profile: bool) -> dict:
    ours = runner.gptforge(config, [], "" if profile else None)
    row = {"model": config, "gptforge": ours, "nanogpt": None, "ratio": None}
    if runner.plan.nanogpt is not None:
        theirs = runner.nanogpt(config)
        row["nanogpt"] = with_mfu(theirs, ours.get("flops_per_token"), ours.get("peak_tflops"))
        if "failed" not in ours and "failed" not in theirs:
            row["ratio"] = ours["tokens_per_s"] / theirs["tokens_per_s"]
            row["ratio_synced"] = ours["tokens_per_s_synced"] / theirs["tokens_per_s"]
    return row


def lever_row(runner: Runner, lever: Lever, baseline: dict) -> dict:
    from gptforge.core.installed import import_error

    row = {"lever": lever.name, "overrides": expand(lever.overrides, runner.plan.batch), "env": list(lever.env),
           "prediction": lever.prediction}
    if lever.needs and import_error(lever.needs):
        row["result"] = {"failed": f"skipped: {lever.needs} is not importable here"}
        return row
    profile = f"-{lever.name}" if runner.plan.profile else None
    result = runner.gptforge(runner.plan.lever_model, row["overrides"], profile, lever.env)
    fell_back = [n["message"] for n in result.get("notes", []) if n["severity"] == "warning"]
    if fell_back:  # the trainer fell back (e.g. TE asked for, not usable): the figure is not this lever's
        result = {"failed": "not applied: " + "; ".join(fell_back)}
    if "failed" not in result and "failed" not in baseline:
        result["speedup"] = result["tokens_per_s"] / baseline["tokens_per_s"]
        if result["peak_mem_gib"] is not None and baseline["peak_mem_gib"] is not None:
            result["mem_delta_gib"] = result["peak_mem_gib"] - baseline["peak_mem_gib"]
    row["result"] = result
    return row


def write_json(plan: Plan) -> Path:
    path = plan.out / "throughput.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(plan.rows, indent=2))
    tmp.replace(path)
    return path


def execute(plan: Plan) -> int:
    runner = Runner(plan)
    try:
        return measure_all(plan, runner)
    finally:
        shutil.rmtree(runner.work, ignore_errors=True)


def measure_all(plan: Plan, runner: Runner) -> int:
    plan.rows["settings"] = {"batch": plan.batch, "precision": plan.precision, "device": plan.device, "set": plan.sets,
                             "warmup": plan.warmup, "steps": plan.steps, "nanogpt_bias": plan.nanogpt_bias,
                             "budget_s": plan.budget_s, "min_ratio": plan.min_ratio}
    baselines = {}
    for config in plan.models:
        row = compare(runner, config, plan.profile and config == plan.lever_model)
        plan.rows["comparison"].append(row)
        baselines[config] = row["gptforge"]
        print_comparison_row(row)
        write_json(plan)
    if plan.levers:
        baseline = baselines.get(plan.lever_model) or runner.gptforge(plan.lever_model, [], "" if plan.profile else None)
        print(f"\nlevers on {plan.lever_model}, one at a time against the baseline "
              f"({fmt_rate(baseline)}; prediction written before measuring):")
        for lever in plan.levers:
            row = lever_row(runner, lever, baseline)
            plan.rows["levers"].append(row)
            print_lever_row(row)
            write_json(plan)
    return verdict(plan, write_json(plan))


def verdict(plan: Plan, path: Path) -> int:
    ratios = [r["ratio"] for r in plan.rows["comparison"]]
    print(f"\nJSON: {path}")
    if plan.min_ratio is None:
        return 0
    low = [(r["model"], r["ratio"]) for r in plan.rows["comparison"] if r["ratio"] is None or r["ratio"] < plan.min_ratio]
    plan.rows["pass"] = not low
    write_json(plan)
    if low:
        what = ", ".join(f"{m}: {'not measured' if x is None else f'{x:.3f}x'}" for m, x in low)
        print(f"below --min-ratio {plan.min_ratio}: {what}")
        return 1
    print(f"all ratios >= {plan.min_ratio}: {', '.join(f'{x:.3f}x' for x in ratios)}")
    return 0


def fmt_rate(r: dict | None) -> str:
    if not r:
        return "not run"
    if "failed" in r:
        return f"failed ({r['failed']})"
    util = f"{100 * r['mfu']:.1f}% MFU" if r.get("mfu") is not None else "MFU n/a"
    mem = f"{r['peak_mem_gib']:.1f} GiB" if r.get("peak_mem_gib") is not None else "mem n/a"
    return f"{r['tokens_per_s']:,.0f} tok/s, {r['ms_per_step']:.1f} ms/step, {util}, peak {mem}"


def print_comparison_row(row: dict) -> None:
    g = row["gptforge"]
    peak = f"peak {g['peak_tflops']:.1f} TFLOP/s dense bf16" if g.get("peak_tflops") else "no bf16 peak known"
    where = f" on {g['device_name']} ({peak}), torch {g['torch']}" if "failed" not in g else ""
    print(f"\n{row['model']}{where}")
    print(f"  gptforge  {fmt_rate(g)}")
    if "tokens_per_s_synced" in g:
        print(f"            {g['tokens_per_s_synced']:,.0f} tok/s, {g['ms_per_step_synced']:.1f} ms/step reading each step's loss at once")
    if "step_ms_median" in g:
        full = g["gc_collections"]["gen2"]
        print(f"            steps {g['step_ms_median']:.1f} ms median, {g['step_ms_max']:.1f} max; "
              f"{full['count']} full garbage collections ({full['ms']:.0f} ms)")
    if g.get("graph_breaks"):
        print(f"            graph breaks: {g['graph_breaks']} ({'; '.join(g['graph_break_reasons'])})")
    if row["nanogpt"] is not None:
        print(f"  nanoGPT   {fmt_rate(row['nanogpt'])}")
        print(f"  ratio     {row['ratio']:.3f}x (each step's loss read at once: {row['ratio_synced']:.3f}x)"
              if row["ratio"] is not None else "  ratio     n/a")


def print_lever_row(row: dict) -> None:
    r = row["result"]
    head = f"  {row['lever']:<16} ({' '.join(row['overrides'] + row['env'])})"
    print(head)
    print(f"      predicted: {row['prediction']}")
    if "failed" in r:
        print(f"      measured:  {r['failed']}")
        return
    mem = f", memory {r['mem_delta_gib']:+.1f} GiB" if "mem_delta_gib" in r else ""
    speed = f"{100 * (r['speedup'] - 1):+.1f}% tok/s" if "speedup" in r else "no baseline"
    print(f"      measured:  {speed}{mem} ({fmt_rate(r)})")


# ---- the command line -------------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> Plan:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nanogpt", type=Path, metavar="DIR", help="a karpathy/nanoGPT checkout (bench.py); none: gptforge only")
    p.add_argument("--models", default="gpt2-124m,gpt2-350m", help="comma list of packaged config names or .toml paths")
    p.add_argument("--batch", type=int, default=32, help="sequences per optimizer step, both codes (default 32)")
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp32"), help="autocast dtype, both codes")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run of the whole script")
    p.add_argument("--set", default="", metavar="K=V,...", help="config keys for every gptforge run (e.g. the winning levers)")
    p.add_argument("--levers", default=None, help=f"comma list, or 'all', or 'none' (default all: {','.join(DEFAULT_LEVERS)})")
    p.add_argument("--lever-model", default=None, help="the model the levers are measured on (default: the first)")
    p.add_argument("--nanogpt-bias", choices=("true", "false"), default="true",
                   help="nanoGPT with GPT-2's biases as gptforge has them (true) or its bench.py default (false)")
    p.add_argument("--warmup", type=int, default=10, help="untimed gptforge steps first (compilation happens here)")
    p.add_argument("--steps", type=int, default=40, help="timed gptforge steps")
    p.add_argument("--budget-s", type=float, default=540, help="stop starting measurements after this many seconds")
    p.add_argument("--min-ratio", type=float, default=None, help="exit 1 when a gptforge/nanoGPT ratio is below this")
    p.add_argument("--profile", action="store_true", help="also write a torch.profiler kernel table of the lever model's baseline and of each lever")
    a = p.parse_args(argv)
    return make_plan(a)


def make_plan(a) -> Plan:
    from gptforge.errors import UsageError
    from gptforge.train.config import load_config, validate

    for flag, value in (("--batch", a.batch), ("--warmup", a.warmup), ("--steps", a.steps), ("--budget-s", a.budget_s)):
        if value <= 0 or (flag == "--warmup" and value < 1):
            raise Usage(f"{flag}: must be positive, got {value}")
    if a.min_ratio is not None and a.min_ratio <= 0:
        raise Usage(f"--min-ratio: must be positive, got {a.min_ratio}")
    if a.nanogpt is not None and (why := nanogpt_bench.check_checkout(a.nanogpt)):
        raise Usage(f"--nanogpt: {why} (clone github.com/karpathy/nanoGPT and pass its directory)")
    models = [m for m in a.models.split(",") if m]
    sets = [s for s in a.set.split(",") if s]
    names = DEFAULT_LEVERS if a.levers in (None, "all") else () if a.levers == "none" else tuple(x for x in a.levers.split(",") if x)
    unknown = [n for n in names if n not in LEVERS]
    if unknown:
        raise Usage(f"--levers: unknown lever {unknown[0]!r} (known: {', '.join(LEVERS)})")
    if not models:
        raise Usage("--models: no model given (e.g. --models gpt2-124m)")
    lever_model = a.lever_model or models[0]
    try:
        base = base_overrides(a.batch, a.precision, a.warmup, a.steps)
        for config in dict.fromkeys([*models, lever_model]):  # bad configs, keys and values fail before any GPU time
            validate(load_config(config, base + sets)[0])
        for n in names:
            validate(load_config(lever_model, base + sets + expand(LEVERS[n].overrides, a.batch))[0])
    except UsageError as err:
        raise Usage(err.one_line()) from None
    out = Path(os.environ.get("GPTFORGE_BENCH_OUT", "."))
    return Plan(models, a.batch, a.precision, a.device, sets, [LEVERS[n] for n in names], lever_model, a.nanogpt,
                a.nanogpt_bias == "true", a.warmup, a.steps, a.budget_s, a.min_ratio, a.profile, out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--one"]:
        return child_main(argv[1])
    try:
        plan = parse_args(argv)
        plan.out.mkdir(parents=True, exist_ok=True)
    except Usage as err:
        print(f"throughput.py: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"throughput.py: $GPTFORGE_BENCH_OUT: cannot create {err.filename}: {err.strerror}", file=sys.stderr)
        return 2
    return execute(plan)


if __name__ == "__main__":
    raise SystemExit(main())
