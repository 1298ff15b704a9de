"""How long `gptforge fix-links` takes when nothing is wrong (the every-activation case).

Builds a prefix shaped like a conda-forge CUDA environment (about 1500 entries in lib/, the
CUDA library families as real ELF files, ~150 headers under targets/, a cuda-version record),
repairs it once, then times the no-op check: the library call (plan + libcudart proof in a fresh
process), the plan alone, and the whole CLI as a subprocess. Prints a table; writes
links_noop.json to $GPTFORGE_BENCH_OUT when set.

    python bench/links_noop.py [--runs 30]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from gptforge import links
from gptforge.links.layout import Layout
from gptforge.links.plan import make_plan

CUDA = (12, 8)
FAMILIES = {
    "libcudart": (12, 8, 90), "libcublas": (12, 8, 4, 1), "libcublasLt": (12, 8, 4, 1),
    "libnvJitLink": (12, 8, 93), "libnvrtc": (12, 8, 93), "libcusparse": (12, 5, 8, 93),
    "libcudnn": (9, 10, 2, 21), "libcudnn_ops": (9, 10, 2, 21), "libcudnn_cnn": (9, 10, 2, 21),
    "libcudnn_adv": (9, 10, 2, 21), "libcudnn_graph": (9, 10, 2, 21),
}


def _elf(workdir: str, soname: str, number: int) -> str:
    out = os.path.join(workdir, f"{soname}.{number}.so")
    if not os.path.exists(out):
        src = out + ".c"
        with open(src, "w") as f:
            f.write(f"int cudaRuntimeGetVersion(int *v) {{ *v = {number}; return 0; }}\n")
        subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", out, src], check=True)
    return out


def build_prefix(root: str) -> str:
    prefix = os.path.join(root, "env")
    lib, tlib = os.path.join(prefix, "lib"), os.path.join(prefix, "targets", "x86_64-linux", "lib")
    tinc = os.path.join(prefix, "targets", "x86_64-linux", "include")
    for d in (lib, tlib, tinc, os.path.join(prefix, "include"), os.path.join(prefix, "conda-meta")):
        os.makedirs(d)
    for i in range(1400):  # the rest of a real environment: python, openssl, icu, ...
        with open(os.path.join(lib, f"libother{i}.so.1.0"), "wb") as f:
            f.write(b"\0" * 64)
        if i % 3 == 0:
            os.symlink(f"libother{i}.so.1.0", os.path.join(lib, f"libother{i}.so.1"))
    for i in range(150):
        with open(os.path.join(tinc, f"cuda_header_{i}.h"), "w") as f:
            f.write("/* header */\n")
    for stem, version in FAMILIES.items():
        name = f"{stem}.so.{'.'.join(map(str, version))}"
        shutil.copyfile(_elf(root, f"{stem}.so.{version[0]}", version[0] * 1000 + version[1] * 10), os.path.join(tlib, name))
        os.symlink(f"../targets/x86_64-linux/lib/{name}", os.path.join(lib, name))
    with open(os.path.join(prefix, "conda-meta", "cuda-version-12.8-h5d125a7_3.json"), "w") as f:
        json.dump({"name": "cuda-version", "version": "12.8"}, f)
    return prefix


def timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    if shutil.which("gcc") is None:
        sys.exit("gcc is needed to build the benchmark's libraries")
    root = tempfile.mkdtemp(prefix="gptforge-links-bench-")
    try:
        prefix = build_prefix(root)
        first = links.fix(prefix, CUDA)
        assert first.ok and first.applied > 0, first.findings
        check = links.fix(prefix, CUDA)
        assert check.ok and not check.steps and len(check.verified) == 2
        exe = os.path.join(os.path.dirname(sys.executable), "gptforge")
        cli = [exe] if os.path.exists(exe) else [sys.executable, "-m", "gptforge"]
        env = {k: v for k, v in os.environ.items() if k != "CONDA_PREFIX"}

        rows = [
            ("plan only (in-process)", timed(lambda: make_plan(Layout.of(prefix), CUDA), args.runs)),
            ("plan + libcudart proof (in-process)", timed(lambda: links.fix(prefix, CUDA), args.runs)),
        ]
        commands = [
            ("gptforge fix-links (whole CLI, subprocess)", [*cli, "fix-links", "--prefix", prefix]),
            ("python -m gptforge.links (activation entry)", [sys.executable, "-m", "gptforge.links", "--prefix", prefix]),
            ("gptforge --help (CLI start-up, reference)", [*cli, "--help"]),
            ("python -c pass (interpreter start, reference)", [sys.executable, "-c", "pass"]),
        ]
        # round-robin, so that a change in machine load hits every command alike
        times: dict[str, list[float]] = {name: [] for name, _ in commands}
        for _ in range(max(5, args.runs // 2)):
            for name, argv in commands:
                times[name] += timed(lambda: subprocess.run(argv, check=True, capture_output=True, env=env, cwd=root), 1)
        rows += list(times.items())
        entries = len(os.listdir(os.path.join(prefix, "lib")))
        print(f"no-op fix-links on a prefix with {entries} entries in lib/, {len(FAMILIES)} CUDA library families, "
              f"150 headers ({args.runs} runs; milliseconds)")
        print(f"{'what':48} {'median':>8} {'min':>8} {'max':>8}")
        result = {"lib_entries": entries, "families": len(FAMILIES), "runs": args.runs, "ms": {}}
        for name, times in rows:
            print(f"{name:48} {statistics.median(times):8.1f} {min(times):8.1f} {max(times):8.1f}")
            result["ms"][name] = {"median": statistics.median(times), "min": min(times), "max": max(times)}
        if os.environ.get("GPTFORGE_BENCH_OUT"):
            os.makedirs(os.environ["GPTFORGE_BENCH_OUT"], exist_ok=True)
            with open(os.path.join(os.environ["GPTFORGE_BENCH_OUT"], "links_noop.json"), "w") as f:
                json.dump(result, f, indent=1)
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
