"""One Linear layer, forward + backward, in bf16 and in each FP8 path: where FP8 pays and where it does not.

    PYTHONPATH=src python3 bench/fp8_linear.py                 # the GPT-2 124M shapes and 8192x4096x4096
    PYTHONPATH=src python3 bench/fp8_linear.py --shapes 8192x4096x4096 --profile

Per shape (tokens x in x out) it times, with CUDA events after untimed warm-up steps:
torch nn.Linear bf16 (eager and compiled), te.Linear bf16, te.Linear FP8 delayed and current scaling,
torchao Float8Linear tensorwise and rowwise (compiled), and the bare GEMMs: torch.mm in bf16 and
torch._scaled_mm in FP8 E4M3 (the ceiling FP8 can reach). --profile lists, for TE FP8 delayed, the
CUDA kernels of one step by time, so the cost beside the GEMMs is visible. Paths whose library is
missing are reported as skipped. A table is printed; JSON goes to $GPTFORGE_BENCH_OUT/fp8_linear.json.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

# GPT-2 124M at batch 32 x 1024: the qkv, attention-out, MLP-up and MLP-down Linear layers; then a large one.
DEFAULT_SHAPES = ("32768x768x2304", "32768x768x768", "32768x768x3072", "32768x3072x768", "8192x4096x4096")


def cuda_ms(step, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def launch_ms(step, iters: int) -> float:
    """Host time to issue one STEP (the GPU drained first): where it reaches cuda_ms, the step is bound by
    its Python and launch overhead, not by its kernels."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host * 1000 / iters


def kernel_ms(step, iters: int = 5) -> tuple[float, list[dict]]:
    """GPU kernel time of one STEP (the sum of its kernels' durations, from the profiler): what the step costs
    the GPU where its host time hides the kernels' from CUDA events; and its kernels, longest first."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)
    kernels = [{"kernel": e.key[:100], "us_per_step": e.device_time_total / iters, "calls": e.count // iters}
               for e in events if e.device_time_total > 0]
    return sum(k["us_per_step"] for k in kernels) / 1000, kernels


def write_gpu_report(name: str, rows: list[dict]) -> Path:
    """ROWS with the GPU and torch they came from, as $GPTFORGE_BENCH_OUT/NAME.json (default: here)."""
    out = Path(os.environ.get("GPTFORGE_BENCH_OUT", ".")) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, indent=1))
    return out


def run_gpu_bench(name: str, args, run, print_table) -> int:
    """The shared tail of a GPU benchmark's main: refuse without a GPU, else RUN(ARGS), print its rows'
    table and write them as NAME.json."""
    if not torch.cuda.is_available():
        print(f"{name}: needs a CUDA GPU (none visible)", file=sys.stderr)
        return 2
    rows = run(args)
    print_table(rows)
    write_gpu_report(name, rows)
    return 0


def fwd_bwd(layer, x, grad, context=contextlib.nullcontext):
    def step():
        with context():
            y = layer(x)
        y.backward(grad)
    return step


def torch_linear(k: int, n: int, compiled: bool):
    layer = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
    return torch.compile(layer) if compiled else layer


def te_linear(k: int, n: int):
    import transformer_engine.pytorch as te

    return te.Linear(k, n, bias=True, params_dtype=torch.bfloat16, device="cuda")


def torchao_linear(k: int, n: int, recipe: str):
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    model = torch.nn.Sequential(torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16))
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))
    return torch.compile(model)


def te_autocast(recipe: str):
    from gptforge.model.fp8 import autocast_factory

    return autocast_factory(recipe)


def gemm_steps(m: int, k: int, n: int) -> dict:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    fp8 = torch.float8_e4m3fn
    a8, b8 = a.to(fp8), b.to(fp8)
    one = torch.ones((), device="cuda")
    return {
        "gemm bf16 (fwd only)": lambda: torch.mm(a, b.t()),
        "gemm fp8 e4m3 (fwd only)": lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
    }


def paths(m: int, k: int, n: int):
    """(name, needs-module, factory of a step) in table order."""
    def linear(make, context=contextlib.nullcontext):
        def build():
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            grad = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            return fwd_bwd(make(), x, grad, context)
        return build

    gemms = gemm_steps(m, k, n)
    return [
        ("torch bf16 eager", "", linear(lambda: torch_linear(k, n, False))),
        ("torch bf16 compiled", "", linear(lambda: torch_linear(k, n, True))),
        ("te bf16", "transformer_engine", linear(lambda: te_linear(k, n))),
        ("te fp8 delayed", "transformer_engine", linear(lambda: te_linear(k, n), te_autocast("delayed"))),
        ("te fp8 current", "transformer_engine", linear(lambda: te_linear(k, n), te_autocast("current"))),
        ("torchao fp8 tensorwise", "torchao", linear(lambda: torchao_linear(k, n, "tensorwise"))),
        ("torchao fp8 rowwise", "torchao", linear(lambda: torchao_linear(k, n, "rowwise"))),
        *[(name, "", (lambda s=step: s)) for name, step in gemms.items()],
    ]


def measure(shape: str, warmup: int, iters: int) -> list[dict]:
    m, k, n = (int(p) for p in shape.split("x"))
    rows = []
    for name, needs, build in paths(m, k, n):
        row = {"shape": shape, "path": name}
        if needs and importlib.util.find_spec(needs) is None:
            row["skipped"] = f"{needs} is not installed"
        else:
            try:
                row["ms"] = cuda_ms(build(), warmup, iters)
            except Exception as err:  # a path this GPU or library version cannot run is reported, not fatal
                row["skipped"] = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
        if "ms" in row:
            gemms = 1 if "fwd only" in name else 3  # forward, grad input, grad weight
            row["tflops"] = gemms * 2 * m * k * n / row["ms"] / 1e9
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def profile_te_fp8(shape: str) -> list[dict]:
    """The CUDA kernels of one TE FP8 delayed-scaling step (after warm-up), by time."""
    from torch.profiler import ProfilerActivity, profile

    m, k, n = (int(p) for p in shape.split("x"))
    build = dict((name, b) for name, _, b in paths(m, k, n))["te fp8 delayed"]
    step = build()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in events) or 1
    return [{"kernel": e.key[:90], "us_per_step": e.device_time_total / 5, "share": e.device_time_total / total}
            for e in events[:12]]


def print_table(rows: list[dict]) -> None:
    base = {}
    print(f"{'shape':>16} {'path':<26} {'ms':>8} {'TFLOP/s':>8} {'vs torch bf16':>14}")
    for row in rows:
        if row["path"] == "torch bf16 compiled" and "ms" in row:
            base[row["shape"]] = row["ms"]
        if "ms" not in row:
            print(f"{row['shape']:>16} {row['path']:<26} {'skipped: ' + row['skipped']}")
            continue
        rel = "" if "fwd only" in row["path"] or row["shape"] not in base else f"{base[row['shape']] / row['ms']:.2f}x"
        print(f"{row['shape']:>16} {row['path']:<26} {row['ms']:8.3f} {row['tflops']:8.1f} {rel:>14}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/fp8_linear.py", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma list of TOKENSxINxOUT")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--profile", action="store_true", help="kernel breakdown of TE FP8 delayed on the last shape")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_linear: needs an NVIDIA GPU (sm_89+ for the FP8 paths)", file=sys.stderr)
        return 2
    rows = [row for shape in args.shapes.split(",") for row in measure(shape, args.warmup, args.iters)]
    print(f"GPU: {torch.cuda.get_device_name()} · torch {torch.__version__}")
    print_table(rows)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    if args.profile and importlib.util.find_spec("transformer_engine") is not None:
        result["te_fp8_profile"] = profile_te_fp8(args.shapes.split(",")[-1])
        print("\nTE FP8 delayed, one step's CUDA kernels:")
        for k in result["te_fp8_profile"]:
            print(f"  {k['us_per_step']:9.1f} us  {100 * k['share']:5.1f}%  {k['kernel']}")
    out = Path(os.environ.get("GPTFORGE_BENCH_OUT", "bench-out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8_linear.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
