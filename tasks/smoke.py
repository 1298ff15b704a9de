"""pixi task `smoke`: import everything this environment promises, then train a few steps.

Prints one line per check and a last line with the loss; exits 1 when anything promised is missing or
the model does not learn. The CUDA checks run where the environment has CUDA; the apex import where
`build-apex` built it.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gptforge.compat.project_envs import environment

STEPS = 30
ENV_NAME = os.environ.get("PIXI_ENVIRONMENT_NAME", "")


def check(name: str, ok: bool, detail: str) -> bool:
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return ok


def can_import(module: str) -> tuple[bool, str]:
    try:
        imported = importlib.import_module(module)
    except Exception as err:  # a broken install raises anything, not only ImportError
        return False, f"{type(err).__name__}: {err}"
    return True, getattr(imported, "__version__", "imported")


def nvcc_release() -> str | None:
    home = os.environ.get("CUDA_HOME", "")
    nvcc = shutil.which("nvcc", path=os.path.join(home, "bin")) or shutil.which("nvcc")
    if not nvcc:
        return None
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else None


def cuda_checks(cuda: str) -> list[bool]:
    import torch

    results = [check("torch CUDA", (torch.version.cuda or "").startswith(cuda),
                     f"torch {torch.__version__} built for CUDA {torch.version.cuda} (environment: {cuda})")]
    nvcc = nvcc_release()
    results.append(check("nvcc", nvcc == cuda, f"release {nvcc} on CUDA_HOME/bin or PATH (must equal torch's {cuda})"))
    prefix = os.environ.get("CONDA_PREFIX", "")
    if Path(prefix, ".gptforge", "build-apex.json").exists():
        results.append(check("apex", *can_import("apex.optimizers")))
    return results


def hopper_checks() -> list[bool]:
    """The hopper environment's kernel packages: installed where the CuTe DSL's kernel cache works; on an
    sm_90 GPU, accel=hopper (the gpt2-124m-hopper config, train-gpt2's here) able to run."""
    import torch

    from gptforge.accel.hopper import HOPPER_MODULES, hopper_blocker, sm90
    from gptforge.core.installed import dsl_directory, outside_site_packages

    results = []
    for top in dict.fromkeys(module.split(".")[0] for module in HOPPER_MODULES):
        found = importlib.util.find_spec(top) is not None
        results.append(check(top, found, "installed" if found else "not installed: pixi install -e hopper"))
    dsl = dsl_directory()
    placed = dsl is not None and not outside_site_packages(dsl)
    results.append(check("CuTe DSL", placed, f"in {dsl}" if placed else
                         f"{dsl or 'not installed'}: quack's kernel cache needs it in site-packages"))
    device = torch.device("cuda", 0)
    if torch.cuda.is_available() and sm90(device):
        why = hopper_blocker(device, "bf16", 0.0)
        results.append(check("accel=hopper", why is None, "gpt2-124m-hopper trains with it here" if why is None else why))
    return results


def train() -> bool:
    with tempfile.TemporaryDirectory(prefix="gptforge-smoke-") as run_dir:
        out = subprocess.run([sys.executable, "-m", "gptforge", "train", "--config", "gpt2-tiny",
                              f"train-iters={STEPS}", f"eval-interval={STEPS // 2}",
                              "--run-dir", run_dir, "--json"], capture_output=True, text=True)
        if out.returncode != 0:
            return check("train", False, (out.stderr.strip().splitlines() or ["no output"])[-1])
        summary = json.loads(out.stdout)
    first, last = summary["first_val_loss"], summary["final_val_loss"]
    return check("train", last < first, f"{STEPS} steps of gpt2-tiny: validation loss {first:.3f} -> {last:.3f}")


def main() -> int:
    env = environment(ENV_NAME) if ENV_NAME else None
    results = [check(module, *can_import(module)) for module in ("torch", "numpy", "tokenizers", "gptforge")]
    if env is not None and env.cuda:
        results += cuda_checks(env.cuda)
    if env is not None and env.name == "hopper":
        results += hopper_checks()
    if importlib.util.find_spec("deepspeed") is not None:
        results.append(check("deepspeed", *can_import("deepspeed")))
    results.append(train())
    print(f"smoke: {'passed' if all(results) else 'FAILED'} ({sum(results)} of {len(results)} checks)")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
