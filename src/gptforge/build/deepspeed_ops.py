"""`gptforge build deepspeed-ops`: a DeepSpeed wheel with chosen ops precompiled (DS_BUILD_<OP>=1).

Same preflight, arch logic and wheel cache as apex, with two DeepSpeed specifics: its arch parser
(``compute_capability_args``) does ``int()`` on the minor, so ``9.0a`` fails with
``invalid literal for int() with base 10: '0a'`` -- it gets the list without suffixes; and its own
nvcc/torch minor-version table (compat engine) instead of apex's exact match.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from gptforge.build import jobs
from gptforge.build.apex import choose_arch_list
from gptforge.build.cache import cache_key, default_cache_root
from gptforge.build.runner import run_logged
from gptforge.build.source import deepspeed_pin
from gptforge.build.toolchain import Toolchain
from gptforge.build.wheels import cached_wheel
from gptforge.core.findings import Finding, Severity
from gptforge.core.installed import installed_version
from gptforge.errors import GptforgeError, UsageError

SDIST_VERSION = re.compile(r"deepspeed-(\d+\.\d+\.\d+[\w.]*)\.(?:tar\.gz|zip)$")


@dataclass
class DeepSpeedPlan:
    source: str  # a path (sdist or tree) or a requirement "deepspeed==X" pip fetches
    version: str | None
    ops: list[str]
    arch_list: str
    arch_origin: str
    max_jobs: int
    env: dict[str, str]
    pip_command: list[str]
    cache_dir: str
    cache_key: str
    key_inputs: dict
    notes: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def parse_ops(text: str | None) -> list[str]:
    known = deepspeed_pin()["ops"]
    ops = [o.strip() for o in (text or ",".join(deepspeed_pin()["default_ops"])).split(",") if o.strip()]
    unknown = [o for o in ops if o not in known]
    if unknown or not ops:
        raise UsageError("--ops", f"unknown op(s) {', '.join(unknown) or '(none given)'}", f"choose from {', '.join(known)}")
    return sorted(dict.fromkeys(ops))


@dataclass(frozen=True)
class DeepSpeedSource:
    spec: str  # what pip builds: a path (sdist or tree) or "deepspeed==X"
    version: str | None
    source_id: str  # the cache-key input naming the source


def resolve_source(src: Path | None, version: str | None) -> DeepSpeedSource:
    if src is not None:
        path = src.expanduser().resolve()
        if not path.exists():
            raise UsageError("--src", f"{path} does not exist", "give a DeepSpeed sdist (.tar.gz) or source tree")
        if path.is_file():
            m = SDIST_VERSION.search(path.name)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            return DeepSpeedSource(str(path), m.group(1) if m else version, f"sdist-sha256:{digest}")
        if not (path / "setup.py").is_file() or not (path / "op_builder").is_dir():
            raise UsageError("--src", f"{path} is not a DeepSpeed source tree (no setup.py and op_builder/)",
                             "give a DeepSpeed sdist (.tar.gz) or a checkout of https://github.com/deepspeedai/DeepSpeed")
        ver_file = path / "version.txt"
        found = ver_file.read_text().strip() if ver_file.is_file() else version
        from gptforge.build.source import tree_digest

        return DeepSpeedSource(str(path), found, f"tree-sha256:{tree_digest(path)}")
    version = version or installed_version("deepspeed")
    if version is None:
        raise UsageError("--version", "DeepSpeed is not installed here, so there is no version to build its ops for",
                         "run it in an environment with DeepSpeed (the project's GPU environments have it), "
                         "or pass --version X.Y.Z or --src with a DeepSpeed sdist")
    try:
        Version(version)
    except InvalidVersion:
        raise UsageError("--version", f"{version!r} is not a version", "e.g. --version 0.19.8") from None
    return DeepSpeedSource(f"deepspeed=={version}", version, f"pypi:deepspeed=={version}")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def plan_deepspeed(ops: list[str], tc: Toolchain, *, source: DeepSpeedSource, arch: str | None, jobs_n: int | None,
                   cache_root: Path | None) -> DeepSpeedPlan:
    arch_list, origin = choose_arch_list(arch, tc, allow_suffix=False)
    cores, free_gib = jobs.machine_capacity()
    max_jobs = jobs_n or jobs.budget(cores, free_gib)
    env = {"DS_BUILD_OPS": "0", **{f"DS_BUILD_{op.upper()}": "1" for op in ops},
           "TORCH_CUDA_ARCH_LIST": arch_list, "MAX_JOBS": str(max_jobs)}
    if tc.cuda_home:
        env["CUDA_HOME"] = tc.cuda_home
    notes = []
    inherited = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if inherited and inherited != arch_list and not arch:
        notes.append(Finding("arch-list-env-replaced", Severity.WARNING, f"TORCH_CUDA_ARCH_LIST={inherited} from the "
                             f"environment is replaced by {arch_list} (DeepSpeed cannot parse 'a'/'f' suffixes)"))
    key_inputs = {"package": "deepspeed", "source": source.source_id, "torch": tc.torch_version, "torch_cuda": tc.torch_cuda,
                  "python": tc.python_tag, "arch_list": arch_list, "ops": ops}
    if any(op.startswith("cpu_") for op in ops):
        # DeepSpeed compiles its CPU ops with -march=native: the wheel only suits this CPU model.
        key_inputs["cpu"] = cpu_model()
    root = (cache_root or default_cache_root()).expanduser().resolve()
    pip_cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-cache-dir", "--no-build-isolation",
               "--disable-pip-version-check", "-w", "<workdir>/dist", source.spec]
    return DeepSpeedPlan(source.spec, source.version, ops, arch_list, origin, max_jobs, env, pip_cmd, str(root / "deepspeed"),
                         cache_key(key_inputs), key_inputs, notes)


def build_and_install(plan: DeepSpeedPlan, *, force: bool, quiet: bool, install: bool = True) -> dict:
    def build(work: Path, log: Path) -> Path:
        cmd = [a.replace("<workdir>", str(work)) for a in plan.pip_command]
        run_logged(cmd, env={**os.environ, **plan.env}, cwd=work, log=log, title=f"building DeepSpeed ops {','.join(plan.ops)}",
                   expected=len(plan.ops), quiet=quiet)
        wheels = sorted((work / "dist").glob("deepspeed-*.whl"))
        if not wheels:
            raise GptforgeError("pip reported success but wrote no DeepSpeed wheel", f"see {log}")
        return wheels[0]

    return cached_wheel("deepspeed", Path(plan.cache_dir).parent, plan.cache_key, plan.key_inputs, build, force=force,
                        quiet=quiet, install=install)


def plan_text(plan: DeepSpeedPlan) -> str:
    lines = [f"source:     {plan.source} (DeepSpeed {plan.version or '?'})",
             f"ops:        {', '.join(plan.ops)}",
             f"arch list:  {plan.arch_list}   ({plan.arch_origin}; no 'a' suffix: DeepSpeed's parser needs X.Y)",
             "env:        " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items())),
             "command:    " + " ".join(shlex.quote(a) for a in plan.pip_command),
             f"cache:      {plan.cache_dir}/{plan.cache_key}",
             f"cache key of: {plan.key_inputs}"]
    return "\n".join(lines + [f"note:       {n.message}" for n in plan.notes])
