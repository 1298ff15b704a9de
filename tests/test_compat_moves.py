"""Fixes combine: errors that one torch build + nvcc change resolves point to one move, which works."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from gptforge.compat import Combination, Severity, check
from gptforge.compat.facts import facts
from gptforge.compat.moves import CODE, MOVABLE, find_move
from gptforge.compat.rules import run_rules

F = facts()
TORCH_BUILDS = sorted(f"{release}.0+{v.cuda.tag}" for release, r in F.torch.items() for v in r.variants
                      if v.channel == "pypi")
NVCCS = sorted(f"{major}.{minor}" for major, minor in F.arches)
CCS = sorted({a.cc for a in F.known_arches if not a.suffix and a.cc >= (6, 0)})

combinations = st.builds(
    Combination,
    torch=st.sampled_from(TORCH_BUILDS),
    cuda=st.sampled_from(NVCCS),
    ccs=st.lists(st.sampled_from(CCS), max_size=2).map(lambda c: tuple(c) or None),
    apex=st.none() | st.just("0.1"),
    deepspeed=st.none() | st.sampled_from(["0.8.1", "0.14.0", "0.18.0"]),
    transformer_engine=st.none() | st.sampled_from(["1.1", "1.11", "2.1", "2.5"]),
    flash_attn=st.none() | st.sampled_from(["2.3.2", "2.7.0"]),
)


def _judge(combo):
    return run_rules(combo, suggest=False)


def _errors(findings):
    return {f.code for f in findings if f.severity is Severity.ERROR}


@settings(max_examples=examples(40), deadline=None)
@given(combinations)
def test_the_move_applied_is_accepted_for_the_codes_it_resolves(combo):
    findings = run_rules(combo)
    move = find_move(combo, findings, F, _judge)
    if move is None:
        return
    after = _errors(_judge(move.apply(combo)))
    assert not after & set(move.resolves), (move, after)
    assert after <= _errors(findings), "the move must add no new error"
    if move.torch and move.nvcc:
        assert move.torch.endswith("+cu" + move.nvcc.replace(".", "")), "the move's nvcc matches its torch build"


@settings(max_examples=examples(40), deadline=None)
@given(combinations)
def test_errors_a_move_resolves_never_carry_contradicting_fixes(combo):
    findings = check(combo)
    moves = [f for f in findings if f.code == CODE]
    assert len(moves) <= 1, "the move is said once"
    if moves:
        pointed = {f.fix for f in findings if f.severity is Severity.ERROR and f.code in MOVABLE
                   and f.code in moves[0].message}
        assert len(pointed) == 1, pointed


def test_torch_cu117_with_nvcc_12_2_and_te_gets_the_cu121_build_with_nvcc_12_1():
    """TransformerEngine#553: the maintainer's answer, a torch built for CUDA 12.1 with the same nvcc."""
    findings = check(Combination(torch="2.0.1+cu117", cuda="12.2", transformer_engine="1.1"))
    move = next(f for f in findings if f.code == CODE)
    assert "+cu121 with nvcc 12.1" in move.message
    errors = [f for f in findings if f.severity is Severity.ERROR]
    assert {f.code for f in errors} == {"nvcc-torch-mismatch", "te-unsupported"}
    assert len({f.fix for f in errors}) == 1


def test_one_fix_alone_needs_no_move():
    findings = check(Combination(torch="2.4.0+cu121", cuda="12.4", apex="0.1"))
    assert CODE not in {f.code for f in findings}
    assert any(f.code == "apex-nvcc-mismatch" and "nvcc 12.1" in f.fix for f in findings)
