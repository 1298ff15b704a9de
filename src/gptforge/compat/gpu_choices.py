"""A GPU named ambiguously stands for every product its name may be ('TITAN X': the Maxwell GTX TITAN X, CC 5.2,
or the Pascal TITAN X, CC 6.1): the combination is judged once per choice. An error every choice gives stays an
error; one only some choices give becomes a warning that names the choice and asks for --cc."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

from gptforge.compat.combination import Combination
from gptforge.compat.findings import Finding, Severity, in_order, unique
from gptforge.core.versions import format_cc

_ASK_CC = "give the GPU's compute capability with --cc X.Y (nvidia-smi --query-gpu=name,compute_cap --format=csv)"


def judge_each_choice(combo: Combination, check: Callable[[Combination], list[Finding]]) -> list[Finding]:
    names = [name for name, _ in combo.gpu_choices]
    picks = list(itertools.product(*(ccs for _, ccs in combo.gpu_choices)))
    judged = [check(replace(combo, ccs=tuple(combo.ccs or ()) + pick, gpu_choices=None)) for pick in picks]
    everywhere = set.intersection(*(set(found) for found in judged))
    erring_everywhere = set.intersection(*({f.code for f in found if f.severity == Severity.ERROR} for found in judged))
    kept: list[Finding] = []
    for pick, found in zip(picks, judged):
        as_what = ", ".join(f"the {name} is CC {format_cc(cc)}" for name, cc in zip(names, pick))
        for f in found:
            if f in everywhere:
                kept.append(f)
            elif f.severity != Severity.ERROR or f.code in erring_everywhere:
                kept.append(replace(f, message=f"if {as_what}: {f.message}"))
            else:
                kept.append(replace(f, severity=Severity.WARNING, message=f"if {as_what}: {f.message}",
                                    fix=f"{_ASK_CC}; then: {f.fix}" if f.fix else _ASK_CC))
    return in_order(unique(kept))
