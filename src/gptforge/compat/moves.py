"""One move for several errors: a published torch build and the nvcc that matches it.

Rules fix one finding each, and their fixes can contradict ("use nvcc 11.7" for torch's cu117 next
to "TransformerEngine needs CUDA >= 12.1"). When the errors that a torch build / nvcc change can
resolve carry different fixes, the engine searches the published builds for the nearest one that,
applied, leaves none of those errors and adds no new one, and says it once (``recommended-move``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from packaging.version import Version

from gptforge.compat.combination import Combination
from gptforge.compat.context import Context, build_context
from gptforge.compat.facts import Facts
from gptforge.compat.findings import Finding, Severity
from gptforge.core.versions import CudaVersion

# Errors a different torch build and/or nvcc can resolve.
MOVABLE = frozenset({
    "nvcc-torch-mismatch", "apex-nvcc-mismatch", "deepspeed-cuda-mismatch", "deepspeed-unsupported",
    "te-unsupported", "te-recipe-unsupported", "gpu-arch-not-in-torch", "gpu-arch-unsupported",
    "flash-attn-unsupported", "cxx-standard-unsupported", "fp8-unavailable", "torch-cpu-build",
})
CODE = "recommended-move"


@dataclass(frozen=True)
class Move:
    torch: str | None  # "2.1.2+cu121", None: torch stays
    nvcc: str | None  # "12.1", None: nvcc stays (or was not given)
    resolves: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()  # the GPUs' SASS arches the torch build carries ("sm_90")

    def apply(self, combo: Combination) -> Combination:
        changes: dict = {}
        if self.torch:
            changes.update(torch=self.torch, torch_cuda=None, torch_arch_list=None)
        if self.nvcc:
            changes.update(cuda=self.nvcc)
        return replace(combo, **changes)

    @property
    def text(self) -> str:
        parts = [f"torch {self.torch}" if self.torch else None, f"nvcc {self.nvcc}" if self.nvcc else None]
        return " with ".join(p for p in parts if p)

    @property
    def how(self) -> str:
        parts = []
        if self.torch:
            version, _, tag = self.torch.partition("+")
            parts.append(f"install torch=={version} (the {tag} build)")
        if self.nvcc:
            parts.append(f"nvcc {self.nvcc} (conda-forge cuda-nvcc={self.nvcc})")
        return " with ".join(parts)


def _torch_version(facts: Facts, release: str, current: Version | None) -> str:
    """The user's own version for their release, else the newest recorded patch of that release."""
    if current is not None and f"{current.major}.{current.minor}" == release:
        return current.public
    patches = sorted((Version(v) for v in facts.torch_python if Version(v).release[:2] == Version(release).release),
                     reverse=True)
    return str(patches[0]) if patches else f"{release}.0"


def _distance(a: CudaVersion, b: CudaVersion) -> int:
    return abs(a.major - b.major) * 100 + abs(a.minor - b.minor)


def candidates(ctx: Context) -> Iterator[Move]:
    """Published torch builds (+ the matching nvcc when one is given), nearest first: keep the nvcc
    major the user has, then the torch release (newer before older), then the CUDA closest to theirs."""
    if ctx.torch is None:
        return
    releases = sorted(ctx.facts.torch, key=lambda r: Version(r).release)
    here = ctx.torch.release
    index = releases.index(here) if here in releases else None
    anchor = ctx.nvcc or ctx.torch_cuda
    ranked = []
    for position, release in enumerate(releases):
        if index is None:
            rank = 0
        else:
            rank = position - index if position >= index else 1000 + index - position
        for variant in ctx.facts.torch[release].variants:
            if variant.channel != "pypi":
                continue
            cuda = variant.cuda
            keeps_major = ctx.nvcc is None or cuda.major == ctx.nvcc.major
            distance = _distance(cuda, anchor) if anchor else 0
            torch = f"{_torch_version(ctx.facts, release, ctx.torch.version)}+{cuda.tag}"
            ranked.append(((not keeps_major, rank, distance), Move(torch, str(cuda.release) if ctx.nvcc else None)))
    seen = set()
    for _, move in sorted(ranked, key=lambda pair: pair[0]):
        if move not in seen:
            seen.add(move)
            yield move


def _errors(findings: list[Finding]) -> set[str]:
    return {f.code for f in findings if f.severity is Severity.ERROR}


def find_move(combo: Combination, findings: list[Finding], facts: Facts,
              judge: Callable[[Combination], list[Finding]]) -> Move | None:
    """The nearest move that leaves none of the movable errors and adds no error, when the movable
    errors' fixes differ (one fix, or none to combine, needs no move)."""
    movable = [f for f in findings if f.severity is Severity.ERROR and f.code in MOVABLE]
    if len({f.fix for f in movable}) < 2:
        return None
    ctx = build_context(combo, facts)
    if ctx.torch is None or ctx.torch_is_cpu and ctx.nvcc is None:
        return None
    before, targets = _errors(findings), {f.code for f in movable}
    for move in candidates(ctx):
        after = _errors(judge(move.apply(combo)))
        if not after & targets and after <= before:
            gpus = tuple(f"sm_{major}{minor}" for major, minor in ctx.ccs)
            return replace(move, resolves=tuple(sorted(targets)), gpus=gpus if move.torch else ())
    return None


def combine(combo: Combination, findings: list[Finding], facts: Facts,
            judge: Callable[[Combination], list[Finding]]) -> list[Finding]:
    """The findings with the errors one move resolves pointing to that move, said once."""
    move = find_move(combo, findings, facts, judge)
    if move is None:
        return findings
    pointer = f"apply the recommended move: {move.text}"
    if move.gpus:
        pointer += f" (a build with kernels for {' '.join(move.gpus)})"
    out = [replace(f, fix=pointer) if f.severity is Severity.ERROR and f.code in move.resolves else f
           for f in findings]
    out.append(Finding("recommended-move", Severity.INFO,
                       f"one move resolves {', '.join(move.resolves)}: {move.text}", move.how))
    return out
