"""A GPU name several products share ('TITAN X': CC 5.2 or 6.1) is judged as each of them: an error only where
every choice gives it, else a warning that asks for --cc."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples, run_main
from gptforge.compat import Combination, Severity, check

TITAN_X = ("TITAN X", ((5, 2), (6, 1)))


def _errors(findings) -> set[str]:
    return {f.code for f in findings if f.severity == Severity.ERROR}


def test_an_error_only_one_choice_gives_is_a_warning_that_asks_for_the_cc():
    # mish-cuda#10: TORCH_CUDA_ARCH_LIST=5.2 ran on the user's TITAN X (the Maxwell one)
    found = check(Combination(gpu_choices=(TITAN_X,), torch="1.7.0", cuda="10.2", torch_cuda_arch_list_env="5.2"))
    assert not _errors(found)
    warned = [f for f in found if f.code == "arch-list-misses-gpu"]
    assert [f.severity for f in warned] == [Severity.WARNING] and "--cc" in warned[0].fix


def test_an_error_every_choice_gives_stays_an_error():
    found = check(Combination(gpu_choices=(TITAN_X,), torch="1.7.0", cuda="10.2", torch_cuda_arch_list_env="7.5"))
    assert "arch-list-misses-gpu" in _errors(found)


def test_the_cli_takes_a_shared_name_and_recommend_asks_for_the_cc():
    ran = run_main("compat", "check", "--gpu", "TITAN X", "--torch", "1.7", "--cuda", "10.2", "--arch-list", "5.2",
              "--json")
    assert ran.returncode == 0
    assert {f["code"] for f in json.loads(ran.stdout)["findings"]} >= {"arch-list-misses-gpu"}
    fails = run_main("compat", "check", "--gpu", "TITAN X", "--torch", "1.7", "--cuda", "10.2", "--arch-list", "7.5")
    assert fails.returncode == 1
    assert run_main("compat", "recommend", "--driver", "535", "--gpu", "TITAN X").returncode == 2


ARCH_LISTS = ["5.2", "6.1", "7.5", "5.2;6.1", "8.0", None]


@settings(max_examples=examples(12), deadline=None)
@given(st.sampled_from(ARCH_LISTS), st.sampled_from(["1.7.0", "1.13.1", "2.1.0"]), st.sampled_from(["10.2", "11.8"]))
def test_the_errors_of_a_shared_name_are_those_every_choice_gives(arch_list, torch, cuda):
    # law: judged as 'TITAN X', the error codes are the intersection of those of the GTX TITAN X and the TITAN X
    base = Combination(torch=torch, cuda=cuda, torch_cuda_arch_list_env=arch_list)
    each = [_errors(check(Combination(**{**base.__dict__, "ccs": (cc,)}))) for cc in TITAN_X[1]]
    assert _errors(check(Combination(**{**base.__dict__, "gpu_choices": (TITAN_X,)}))) == each[0] & each[1]
