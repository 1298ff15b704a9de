"""Run karpathy/nanoGPT's own bench.py, unmodified, at a given GPT-2 shape, and read its result.

bench.py names the 124M shape in its GPTConfig(...) call and takes `--key=value` overrides plus a
config file that its configurator exec()s in bench.py's namespace after `from model import GPTConfig`.
The config file written here wraps GPTConfig so the shape comes from us (24 layers for 350M), and
prints the CUDA peak memory at exit (bench.py prints only time per iteration and its A100-based MFU).
bench.py's timing: 10 burn-in steps (compilation included), then 20 timed steps, each with a
loss.item() sync, on one fixed random batch (--real_data=False).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PEAK_TAG = "GPTFORGE_PEAK_MEM_BYTES"
BURN_IN, TIMED = 10, 20  # fixed in bench.py
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

HOOK = '''\
# written by gptforge's bench/throughput.py: the model shape, and the peak memory at exit
_gptforge_shape = dict(n_layer={layers}, n_head={heads}, n_embd={width})
_gptforge_GPTConfig = GPTConfig


def GPTConfig(**kwargs):
    return _gptforge_GPTConfig(**{{**kwargs, **_gptforge_shape}})


import atexit as _gptforge_atexit

if torch.cuda.is_available():
    _gptforge_atexit.register(lambda: print("{tag}", torch.cuda.max_memory_allocated(), flush=True))
else:  # a dry run on a machine without CUDA: bench.py synchronizes unconditionally
    torch.cuda.synchronize = lambda *args, **kwargs: None
'''


def check_checkout(directory: Path) -> str | None:
    """None when DIR is a nanoGPT checkout with bench.py, model.py and configurator.py; else what is wrong."""
    missing = [f for f in ("bench.py", "model.py", "configurator.py") if not (directory / f).is_file()]
    if missing:
        return f"{directory} is not a nanoGPT checkout (no {', '.join(missing)})"
    return None


def command(hook: Path, batch: int, seq: int, device: str, precision: str, compile_: bool, bias: bool) -> list[str]:
    return [sys.executable, "bench.py", str(hook.resolve()), f"--batch_size={batch}", f"--block_size={seq}",
            "--real_data=False", f"--bias={bias}", f"--compile={compile_}", f"--device={device}",
            f"--dtype={DTYPES[precision]}"]


def parse(stdout: str) -> tuple[float | None, int | None]:
    """(ms per iteration, peak memory bytes) from bench.py's output with our hook."""
    ms = re.search(r"time per iteration: ([0-9.]+)ms", stdout)
    peak = re.search(rf"^{PEAK_TAG} (\d+)$", stdout, re.MULTILINE)
    return (float(ms.group(1)) if ms else None), (int(peak.group(1)) if peak else None)


def run(directory: Path, shape: dict, batch: int, device: str, precision: str, compile_: bool, bias: bool,
        timeout: float, work: Path) -> dict:
    """One bench.py run; a dict with ms_per_step, tokens_per_s, peak_mem_gib, or with failed: why."""
    hook = work / f"nanogpt_shape_{shape['layers']}x{shape['width']}.py"
    hook.write_text(HOOK.format(tag=PEAK_TAG, **shape))
    cmd = command(hook, batch, shape["seq"], device, precision, compile_, bias)
    try:
        proc = subprocess.run(cmd, cwd=directory, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"failed": f"nanoGPT bench.py ran past {timeout:.0f} s"}
    ms, peak = parse(proc.stdout)
    if proc.returncode or ms is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"failed": f"bench.py exit {proc.returncode}: " + " | ".join(tail)}
    return {"ms_per_step": ms, "tokens_per_s": batch * shape["seq"] / (ms / 1e3),
            "peak_mem_gib": peak / 2**30 if peak is not None else None, "steps": TIMED, "warmup": BURN_IN,
            "command": " ".join(cmd[1:]), "bias": bias}
