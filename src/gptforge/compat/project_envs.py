"""The project's environments (data/environments.toml) and which one fits a machine, each judged by
the rules that ``recommend`` is given (compat.rules gives its own: this module does not import them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache

from gptforge.compat.arches import CC, parse_arch, runs_on
from gptforge.compat.combination import Combination
from gptforge.compat.facts import load_table
from gptforge.compat.findings import Finding, Severity
from gptforge.core.versions import CudaVersion, DriverVersion, format_cc, parse_cuda, parse_driver

Judge = Callable[[Combination], list[Finding]]


@dataclass(frozen=True)
class Environment:
    name: str
    torch: str
    torch_channel: str
    python: str
    gcc: tuple[str, str]
    why: str
    source: str
    venv: str
    cuda: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    min_driver: str | None = None
    sm: tuple[str, ...] = ()
    variant_of: str | None = None  # the CUDA line this environment extends for speed
    variant_sm: tuple[str, ...] = ()  # the GPUs its own kernels run on

    @property
    def is_gpu(self) -> bool:
        return self.cuda is not None

    @property
    def cuda_version(self) -> CudaVersion | None:
        return parse_cuda(self.cuda) if self.cuda else None

    @property
    def setup(self) -> str:
        return "pixi run -e " + self.name + " setup"

    @property
    def install_hint(self) -> str:
        """How to get this environment, with pixi and without."""
        return f"{self.setup} (without pixi: {self.venv})"

    def covers(self, cc: CC) -> bool:
        return _runs_on_any(self.sm, cc)

    def variant_covers(self, cc: CC) -> bool:
        return _runs_on_any(self.variant_sm, cc)

    def combination(self, driver: str | None = None, ccs: Iterable[CC] | None = None, *,
                    gcc: str | None = None) -> Combination:
        """This environment on a machine with ``driver`` and GPUs ``ccs`` (gcc: its newest by default)."""
        return Combination(
            driver=driver,
            ccs=tuple(ccs) if ccs else None,
            cuda=self.cuda,
            torch=self.torch if self.is_gpu else f"{self.torch}+cpu",
            torch_cuda=self.cuda,
            torch_arch_list=tuple(f"sm_{a.replace('.', '')}" for a in self.sm) if self.is_gpu else None,
            python=self.python,
            gcc=gcc or self.gcc[1],
            cudnn=self.cudnn,
            nccl=self.nccl,
        )


def _runs_on_any(arches: tuple[str, ...], cc: CC) -> bool:
    return any(runs_on(parse_arch(a), cc) for a in arches)


def in_a_venv(line: str, python: str) -> str:
    """LINE run in a new venv of PYTHON where it installs with pip: the hashed exports hold wheels for that Python only."""
    return f"python{python} -m venv .venv && . .venv/bin/activate && {line}" if line.startswith("pip ") else line


@cache
def environments() -> tuple[Environment, ...]:
    rows = load_table("environments.toml")["environment"]
    return tuple(
        Environment(
            name=row["name"], torch=row["torch"], torch_channel=row["torch_channel"], python=row["python"],
            gcc=tuple(row["gcc"]), why=" ".join(row["why"].split()), source=row["source"], venv=in_a_venv(row["venv"], row["python"]),
            cuda=row.get("cuda"), cudnn=row.get("cudnn"), nccl=row.get("nccl"),
            min_driver=row.get("min_driver"), sm=tuple(row.get("sm", ())), variant_of=row.get("variant_of"),
            variant_sm=tuple(row.get("variant_sm", ())),
        )
        for row in rows
    )


def environment(name: str) -> Environment:
    for env in environments():
        if env.name == name:
            return env
    raise KeyError(name)


@dataclass(frozen=True)
class Verdict:
    """One environment judged for one machine."""

    environment: Environment
    fits: bool
    reasons: tuple[str, ...]  # why not (errors), or what to know (warnings)
    findings: tuple[Finding, ...]


@dataclass(frozen=True)
class Recommendation:
    chosen: Environment | None
    verdicts: tuple[Verdict, ...]
    reason: str
    faster: tuple[Environment, ...] = ()  # variants of the chosen line that fit and run on every GPU given

    @property
    def ok(self) -> bool:
        return self.chosen is not None

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "environment": self.chosen.name if self.chosen else None,
            "setup": self.chosen.setup if self.chosen else None,
            "venv": self.chosen.venv if self.chosen else None,
            "reason": self.reason,
            "faster": [{"name": e.name, "setup": e.setup, "why": e.why} for e in self.faster],
            "environments": [
                {"name": v.environment.name, "cuda": v.environment.cuda, "fits": v.fits, "reasons": list(v.reasons)}
                for v in self.verdicts
            ],
        }


def _judge(env: Environment, driver: str | None, ccs: tuple[CC, ...], judge: Judge) -> Verdict:
    if not env.is_gpu:
        note = "runs everywhere, on the CPU only" + (" (the GPUs would sit idle)" if ccs else "")
        return Verdict(env, True, (note,), ())
    findings = tuple(judge(env.combination(driver, ccs)))
    errors = [f.message for f in findings if f.severity is Severity.ERROR]
    too_old = any(f.code == "driver-too-old" for f in findings)
    if driver and env.min_driver and parse_driver(driver) < parse_driver(env.min_driver) and not too_old:
        errors.insert(0, f"needs driver >= {env.min_driver} (environments.toml)")
    if env.variant_of and (missed := [cc for cc in ccs if not env.variant_covers(cc)]):
        errors.append(f"its own kernels run on sm_{', sm_'.join(a.replace('.', '') for a in env.variant_sm)} only, not on "
                      f"CC {', '.join(map(format_cc, missed))}: use {env.variant_of} there")
    warnings = [f.message for f in findings if f.severity is Severity.WARNING]
    fits = not errors
    return Verdict(env, fits, tuple(errors if errors else warnings), findings)


def _rank(verdict: Verdict) -> tuple:
    """Prefer no warnings, then the newest CUDA."""
    has_warning = any(f.severity is Severity.WARNING for f in verdict.findings)
    cuda = verdict.environment.cuda_version
    return (has_warning, -(cuda.major * 100 + cuda.minor) if cuda else 0)


def _faster_variants(line: Environment, verdicts: tuple[Verdict, ...], ccs: tuple[CC, ...]) -> tuple[Environment, ...]:
    """The variants of LINE that fit, their own kernels running on every GPU given (none without GPUs)."""
    if not ccs:
        return ()
    return tuple(v.environment for v in verdicts if v.fits and v.environment.variant_of == line.name)


def recommend(driver: str | DriverVersion | None, ccs: Iterable[CC], judge: Judge) -> Recommendation:
    """Which of the project's environments fits a machine with this driver and these GPUs, and why."""
    driver_text = str(driver) if driver is not None else None
    ccs = tuple(sorted(set(ccs or ())))
    verdicts = tuple(_judge(env, driver_text, ccs, judge) for env in environments())
    lines = sorted((v for v in verdicts if v.fits and v.environment.is_gpu and not v.environment.variant_of), key=_rank)
    if lines:
        best = lines[0]
        why = "; ".join(best.reasons) if best.reasons else "no problem found"
        return Recommendation(best.environment, verdicts, f"{best.environment.name}: {why}",
                              _faster_variants(best.environment, verdicts, ccs))
    if driver_text is None and not ccs:
        cpu = next(v.environment for v in verdicts if not v.environment.is_gpu)
        return Recommendation(cpu, verdicts, "no NVIDIA driver or GPU given: the cpu environment")
    why = "; ".join(f"{v.environment.name}: {v.reasons[0]}" for v in verdicts if not v.fits and v.reasons)
    return Recommendation(None, verdicts, f"no CUDA environment fits ({why}); the cpu environment still runs "
                                          "without the GPU")
