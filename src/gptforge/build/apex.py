"""`gptforge build apex`: plan, preflight, build once into the shared wheel cache, install, verify."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import Version

from gptforge.build import jobs
from gptforge.build.cache import cache_key, default_cache_root
from gptforge.build.flags import CORE_FLAGS, select_flags
from gptforge.build.runner import run_logged
from gptforge.build.source import COMMIT_RE, ApexSource, apex_pin, clone, local_source
from gptforge.build.toolchain import Toolchain
from gptforge.core.findings import Finding, Severity
from gptforge.core.installed import installed_version
from gptforge.build.wheels import cached_wheel
from gptforge.core.versions import parse_cc
from gptforge.errors import GptforgeError, UsageError

SUBSET_ENV = "GPTFORGE_APEX_EXTENSIONS"
# Runs apex's own setup.py with setuptools.setup wrapped to keep only the named ext_modules: the
# sources, flags and build class stay apex's; only the private copy of the tree is changed.
SUBSET_SETUP = """\
import os, runpy, setuptools
_keep = set(os.environ["GPTFORGE_APEX_EXTENSIONS"].split(","))
_setup = setuptools.setup
def _filtered(**kw):
    found = {e.name for e in kw.get("ext_modules", [])}
    if _keep - found:
        raise RuntimeError(f"gptforge: apex declares no extension(s) {sorted(_keep - found)}; it declares {sorted(found)}")
    kw["ext_modules"] = [e for e in kw["ext_modules"] if e.name in _keep]
    return _setup(**kw)
setuptools.setup = _filtered
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "apex_setup.py"), run_name="__main__")
"""


def install_subset_filter(tree: Path) -> None:
    os.replace(tree / "setup.py", tree / "apex_setup.py")
    (tree / "setup.py").write_text(SUBSET_SETUP)


PINNED_ENV_TO_FLAG = {"APEX_CPP_EXT": "--cpp_ext", "APEX_CUDA_EXT": "--cuda_ext"}


@dataclass
class ApexRequest:
    src: Path | None = None
    ref: str | None = None
    arch: str | None = None
    jobs: int | None = None
    cache_root: Path | None = None
    all_contrib: bool = False
    extensions: tuple[str, ...] = ()  # a subset of the extensions the flags declare; () = all of them


@dataclass
class ApexPlan:
    source: str  # "--src /path" or "git <repo> @ <commit>"
    source_id: str  # commit, or sha256 of a non-git tree
    commit: str | None
    arch_list: str
    arch_origin: str
    setup_flags: tuple[str, ...]
    flag_style: str
    pip_version: str
    parallelism: jobs.Parallelism
    env: dict[str, str]  # variables gptforge sets for the build (on top of the caller's environment)
    pip_command: list[str]
    cache_dir: str
    cache_key: str
    key_inputs: dict
    expected_extensions: list[str] = field(default_factory=list)
    notes: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict:
        data = asdict(self)
        data["parallelism"] = asdict(self.parallelism)
        return data


def pip_version() -> Version:
    version = installed_version("pip")
    if version is None:
        raise GptforgeError("pip is not installed here, or its metadata cannot be read; the apex build runs pip",
                            "install pip into this environment (python -m ensurepip)")
    return Version(version)


def apex_repo() -> str:
    """The pinned repository, or a mirror named by GPTFORGE_APEX_REPO (clusters without GitHub access)."""
    return os.environ.get("GPTFORGE_APEX_REPO") or apex_pin()["repo"]


def resolve_source(req: ApexRequest, cache_root: Path) -> tuple[ApexSource | None, str, str, str | None]:
    """(source if already on disk, description, source id, commit). A git source is fetched at build time."""
    if req.src is not None:
        src = local_source(req.src)
        return src, f"--src {src.path}", src.source_id, src.commit
    commit = req.ref or apex_pin()["commit"]
    if not COMMIT_RE.match(commit):
        raise UsageError("--ref", f"{commit!r} is not a full commit hash", "give the 40-character commit, e.g. from git log")
    checkout = cache_root / "src" / f"apex-{commit}"
    existing = local_source(checkout) if (checkout / "setup.py").is_file() else None
    return existing, f"git {apex_repo()} @ {commit}", commit, commit


class NoDefaultArch(UsageError):
    """No --arch and no GPU here that nvcc can target: the plan has no arch list to default to."""


def choose_arch_list(arch: str | None, tc: Toolchain, *, allow_suffix: bool) -> tuple[str, str]:
    """(TORCH_CUDA_ARCH_LIST, where it came from): ``--arch``, else the GPUs present that nvcc can target."""
    from gptforge import compat

    if arch:
        return normalise_arch_list(arch, tc.nvcc_version, allow_suffix), "--arch"
    if not tc.ccs:
        raise NoDefaultArch("--arch", "no GPU is visible, so there is nothing to target by default",
                         "pass the compute capabilities of the GPUs that will run it, e.g. --arch 9.0 (H100) or --arch '8.0;9.0'")
    try:
        chosen = compat.arch_list_for([parse_cc(cc) for cc in tc.ccs], tc.nvcc_version,
                                      allow_suffix=allow_suffix)
    except GptforgeError as err:
        raise NoDefaultArch("--arch", f"nvcc {tc.nvcc_version} cannot target the GPUs present ({', '.join(tc.ccs)}): {err.message}",
                         "install a CUDA toolkit that supports them (see `gptforge compat`), or pass --arch") from None
    return chosen, f"GPUs present ({', '.join(tc.ccs)}) ∩ nvcc {tc.nvcc_version}"


def normalise_arch_list(text: str, nvcc: str | None, allow_suffix: bool) -> str:
    """'9.0a, 8.0' -> '8.0;9.0a' (sorted, deduplicated); without suffixes for consumers that cannot parse
    them (DeepSpeed); every entry checked against what ``nvcc`` can target."""
    from gptforge import compat
    from gptforge.compat.arches import parse_arch_list

    try:
        sass, ptx = parse_arch_list(text)
        targetable = set(compat.targetable_arches(nvcc)) if nvcc else None
    except (GptforgeError, ValueError) as err:
        raise UsageError("--arch", str(getattr(err, "message", err)), "write it like 9.0 or '8.0;9.0a' or '8.6+PTX'") from None
    if not sass:
        raise UsageError("--arch", "the arch list is empty", "e.g. --arch 9.0")
    chosen: dict = {}
    for a in sass:
        key = a if allow_suffix else a.base
        chosen[key] = chosen.get(key, False) or a in ptx  # "9.0+PTX;9.0a" without suffixes keeps the PTX
    if targetable is not None and (bad := [str(a) for a in chosen if str(a) not in targetable]):
        raise UsageError("--arch", f"nvcc {nvcc} cannot target {', '.join(bad)}",
                         f"choose from {', '.join(sorted(targetable, key=lambda s: (float(s.rstrip('af')), s)))}")
    return ";".join(f"{a}{'+PTX' if has_ptx else ''}" for a, has_ptx in sorted(chosen.items()))


def job_env(par: jobs.Parallelism, parallel_ok: bool) -> dict[str, str]:
    env = {"MAX_JOBS": str(par.max_jobs)}
    if parallel_ok:
        env["APEX_PARALLEL_BUILD"] = str(par.extensions)
    if par.nvcc_threads > 1:
        env["NVCC_APPEND_FLAGS"] = f"{os.environ.get('NVCC_APPEND_FLAGS', '')} --threads {par.nvcc_threads}".strip()
    return env


def plan_apex(req: ApexRequest, tc: Toolchain) -> tuple[ApexPlan, ApexSource | None]:
    pin = apex_pin()
    cache_root = (req.cache_root or default_cache_root()).expanduser().resolve()
    src, desc, source_id, commit = resolve_source(req, cache_root)
    pinned = commit == pin["commit"]
    env_to_flag = src.env_to_flag if src else (PINNED_ENV_TO_FLAG if pinned and pin["reads_env_flags"] else None)
    parallel_ok = src.parallel_build if src else (pinned and pin["parallel_build"])
    arch, arch_origin = choose_arch_list(req.arch, tc, allow_suffix=True)
    pip_v = pip_version()
    flags = select_flags(CORE_FLAGS, env_to_flag, pip_v)
    env, notes = dict(flags.env), []
    if req.all_contrib:
        if flags.style != "env":
            raise UsageError("--all-contrib", "this apex predates APEX_ALL_CONTRIB_EXT", "use a newer --ref, or the pinned commit")
        env["APEX_ALL_CONTRIB_EXT"] = "1"
    if req.extensions:
        env[SUBSET_ENV] = ",".join(req.extensions)
        notes.append(Finding("apex-extension-subset", Severity.INFO,
                             f"only {', '.join(req.extensions)}: setup.py runs under a filter in the private build copy"))
    expected = list(req.extensions) or ([] if req.all_contrib else list(pin["core_extensions"]))
    cores, free_gib = jobs.machine_capacity()
    par = jobs.plan_parallelism(req.jobs or jobs.budget(cores, free_gib),
                                (len(expected) or len(pin["core_extensions"])) if parallel_ok else 1, len(arch.split(";")))
    env.update(job_env(par, parallel_ok), TORCH_CUDA_ARCH_LIST=arch)
    if not parallel_ok:
        notes.append(Finding("apex-serial-build", Severity.INFO,
                             "this apex builds its extensions one after another (no APEX_PARALLEL_BUILD)"))
    if tc.cuda_home:
        env["CUDA_HOME"] = tc.cuda_home
    inherited = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if inherited and not req.arch and inherited != arch:
        notes.append(Finding("arch-list-env-replaced", Severity.WARNING,
                             f"TORCH_CUDA_ARCH_LIST={inherited} from the environment is replaced; pass --arch to choose"))
    key_inputs = {
        "package": "apex", "source": source_id, "torch": tc.torch_version, "torch_cuda": tc.torch_cuda,
        "python": tc.python_tag, "arch_list": arch, "flags": sorted(CORE_FLAGS) + (["all_contrib"] if req.all_contrib else []),
        "extensions": sorted(req.extensions),
    }
    pip_cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-cache-dir",
               "--disable-pip-version-check", *flags.pip_args, "-w", "<workdir>/dist", "<workdir>/apex"]
    plan = ApexPlan(desc, source_id, commit, arch, arch_origin, CORE_FLAGS, flags.style, str(pip_v), par, env, pip_cmd,
                    str(cache_root / "apex"), cache_key(key_inputs), key_inputs, expected, notes)
    return plan, src


def build_wheel(plan: ApexPlan, src: ApexSource | None, workdir: Path, log: Path, quiet: bool) -> Path:
    """Compile apex in ``workdir`` (a private copy of the source, so a shared --src stays clean)."""
    if src is None:  # git: fetch the commit now, only because the cache missed
        src = clone(apex_repo(), plan.commit, Path(plan.cache_dir).parent / "src" / f"apex-{plan.commit}")
    tree = workdir / "apex"
    shutil.copytree(src.path, tree, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__"))
    if plan.env.get(SUBSET_ENV):
        install_subset_filter(tree)
    dist = workdir / "dist"
    cmd = [a.replace("<workdir>", str(workdir)) for a in plan.pip_command]
    env = {**os.environ, **plan.env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    run_logged(cmd, env=env, cwd=tree, log=log, title="building apex", expected=len(plan.expected_extensions) or None,
               quiet=quiet)
    wheels = sorted(dist.glob("apex-*.whl"))
    if not wheels:
        raise GptforgeError("pip reported success but wrote no apex wheel", f"see {log}")
    return wheels[0]


def build_and_install(plan: ApexPlan, src: ApexSource | None, *, force: bool, quiet: bool, install: bool = True) -> dict:
    return cached_wheel("apex", Path(plan.cache_dir).parent, plan.cache_key, plan.key_inputs,
                        lambda work, log: build_wheel(plan, src, work, log, quiet), force=force, quiet=quiet,
                        install=install)


def plan_text(plan: ApexPlan) -> str:
    lines = [
        f"source:        {plan.source}",
        f"commit:        {plan.commit or '(not a git checkout) ' + plan.source_id}",
        f"arch list:     {plan.arch_list}   ({plan.arch_origin})",
        f"jobs:          budget {plan.parallelism.budget}: APEX_PARALLEL_BUILD={plan.parallelism.extensions} x "
        f"MAX_JOBS={plan.parallelism.max_jobs}, nvcc --threads {plan.parallelism.nvcc_threads}",
        f"flags:         {' '.join(plan.setup_flags)} via {plan.flag_style} (pip {plan.pip_version})",
        "env:           " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items())),
        "command:       " + " ".join(shlex.quote(a) for a in plan.pip_command),
        f"cache:         {plan.cache_dir}/{plan.cache_key}",
        f"cache key of:  {plan.key_inputs}",
    ]
    if plan.expected_extensions:
        lines.append(f"extensions:    {', '.join(plan.expected_extensions)}")
    lines += [f"note:          {n.message}" for n in plan.notes]
    return "\n".join(lines)
