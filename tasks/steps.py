"""The steps of `pixi run setup` that depend on what this machine and environment have.

    python tasks/steps.py fix-links|build-helpers|build-apex [gptforge arguments...]

Each step runs the gptforge command, or says in one line why it is skipped (no CUDA toolkit in the
environment, no GPU on the machine) and exits 0, so `setup` does everything that can be done here.
After a success it leaves a stamp in the environment prefix; pixi.toml names the stamps as task
outputs, so an unchanged rerun is skipped and a reinstalled environment builds again.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from gptforge.cli import main as gptforge
from gptforge.probe.nvcc import cuda_home_setting
from gptforge.probe.nvml import probe_nvml


def skip(step: str, why: str) -> int:
    print(f"{step}: skipped: {why}", flush=True)
    return 0


def stamp(step: str, argv: list[str]) -> None:
    prefix = os.environ.get("CONDA_PREFIX")
    if not prefix:
        return
    folder = Path(prefix) / "share" / "gptforge"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{step}.json.{os.getpid()}"
    tmp.write_text(json.dumps({"step": step, "argv": argv}) + "\n", encoding="utf-8")
    tmp.replace(folder / f"{step}.json")


def run(step: str, argv: list[str]) -> int:
    code = gptforge(argv)
    if code == 0:
        stamp(step, argv)
    return code


def fix_links(extra: list[str]) -> int:
    home = os.environ.get("CUDA_HOME")
    if home:
        return run("fix-links", ["fix-links", "--prefix", home, *extra])
    if environment := os.environ.get("PIXI_ENVIRONMENT_NAME"):
        return skip("fix-links", f"the {environment} environment has no CUDA toolkit (it sets no CUDA_HOME)")
    return skip("fix-links", "CUDA_HOME is not set (a pixi CUDA environment sets it; to repair another prefix: "
                             "gptforge fix-links --prefix PREFIX)")


def build_helpers(extra: list[str]) -> int:
    return run("build-helpers", ["build", "helpers", *extra])


def build_apex(extra: list[str]) -> int:
    if not probe_nvml()["gpus"] and "--arch" not in extra:
        return skip("build-apex", "no NVIDIA GPU on this machine (apex is built for the GPUs present and "
                                  "checked on them; on a build node: pixi run build-apex --arch 9.0 --no-install)")
    home, _ = cuda_home_setting(dict(os.environ))  # where the build looks, as torch's cpp_extension does
    if home is None:
        return skip("build-apex", "no CUDA toolkit: no CUDA_HOME or CUDA_PATH, no nvcc on PATH, no /usr/local/cuda")
    return run("build-apex", ["build", "apex", *extra])


STEPS = {"fix-links": fix_links, "build-helpers": build_helpers, "build-apex": build_apex}


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in STEPS:
        sys.exit(f"usage: python tasks/steps.py {'|'.join(STEPS)} [gptforge arguments...]")
    sys.exit(STEPS[sys.argv[1]](sys.argv[2:]))
