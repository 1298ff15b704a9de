"""Flag selection for apex builds, across apex and pip versions (property tests), and the job plan."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from packaging.version import Version

from gptforge.build.flags import CONFIG_SETTINGS_SINCE, select_flags
from gptforge.build.jobs import GIB_PER_JOB, budget, plan_parallelism

FLAGS = ["--cpp_ext", "--cuda_ext", "--xentropy", "--fast_layer_norm", "--distributed_adam", "--group_norm"]
ENV_TO_FLAG = {"APEX_" + f.strip("-").upper(): f for f in FLAGS}

pip_versions = st.builds(lambda a, b, c: Version(f"{a}.{b}.{c}"), st.integers(9, 26), st.integers(0, 4), st.integers(0, 3))
flag_sets = st.lists(st.sampled_from(FLAGS), min_size=1, max_size=len(FLAGS), unique=True).map(tuple)


@given(flag_sets, pip_versions, st.booleans())
def test_build_isolation_is_always_off(flags, pip, modern_apex):
    chosen = select_flags(flags, ENV_TO_FLAG if modern_apex else None, pip)
    assert chosen.pip_args[0] == "--no-build-isolation"
    assert "--no-build-isolation" in chosen.pip_args


@given(flag_sets, pip_versions)
def test_apex_that_reads_env_gets_env_vars_on_any_pip(flags, pip):
    chosen = select_flags(flags, ENV_TO_FLAG, pip)
    assert chosen.style == "env"
    assert chosen.env == {env: "1" for env, flag in ENV_TO_FLAG.items() if flag in flags}
    assert not any("--build-option" in a or "--global-option" in a for a in chosen.pip_args)


@given(flag_sets, pip_versions)
def test_old_apex_gets_command_line_flags_by_pip_version(flags, pip):
    chosen = select_flags(flags, None, pip)
    assert chosen.env == {}
    if pip >= CONFIG_SETTINGS_SINCE:
        assert chosen.style == "config-settings"
        assert [a for a in chosen.pip_args if a != "--no-build-isolation"] == [
            f"--config-settings=--build-option={f}" for f in flags]
    else:
        assert chosen.style == "global-option"
        assert [a for a in chosen.pip_args if a != "--no-build-isolation"] == [f"--global-option={f}" for f in flags]


@given(flag_sets, pip_versions)
def test_flag_the_env_table_lacks_falls_back_to_command_line(flags, pip):
    partial = {env: flag for env, flag in ENV_TO_FLAG.items() if flag != flags[0]}
    chosen = select_flags(flags, partial, pip)
    assert chosen.style in ("config-settings", "global-option")
    assert any(flags[0] in a for a in chosen.pip_args)


def test_pip_boundary_is_23_1():
    assert select_flags(("--cpp_ext",), None, Version("23.0.1")).style == "global-option"
    assert select_flags(("--cpp_ext",), None, Version("23.1")).style == "config-settings"


@given(st.integers(1, 256), st.integers(1, 30), st.integers(1, 8))
def test_parallelism_stays_within_budget(jobs, n_ext, n_archs):
    par = plan_parallelism(jobs, n_ext, n_archs)
    assert 1 <= par.extensions <= min(n_ext, jobs)
    assert 1 <= par.max_jobs <= jobs
    assert 1 <= par.nvcc_threads <= n_archs


@given(st.integers(1, 512), st.floats(0, 2048))
def test_budget_respects_cores_and_memory(cores, free_gib):
    b = budget(cores, free_gib)
    assert 1 <= b <= cores
    assert b == 1 or b * GIB_PER_JOB <= free_gib


def test_sixteen_core_host_plan():
    par = plan_parallelism(budget(16, 120.0), 12, 1)
    assert (par.budget, par.extensions, par.max_jobs, par.nvcc_threads) == (16, 12, 8, 1)


TARGETS_13_0 = ["7.5", "8.0", "8.6", "8.9", "9.0", "9.0a", "10.0", "10.0a", "12.0", "12.0f"]
arch_items = st.lists(st.tuples(st.sampled_from(TARGETS_13_0), st.booleans()), min_size=1, max_size=6)


@given(arch_items, st.sampled_from([";", " ", ", "]), st.booleans())
def test_arch_list_normalisation_properties(items, sep, allow_suffix):
    from gptforge.build.apex import normalise_arch_list

    text = sep.join(f"{a}{'+PTX' if ptx else ''}" for a, ptx in items)
    out = normalise_arch_list(text, "13.0", allow_suffix)
    entries = out.split(";")
    assert normalise_arch_list(out, "13.0", allow_suffix) == out  # idempotent
    assert len(entries) == len(set(entries))
    bases = [e.split("+")[0] for e in entries]
    assert bases == sorted(bases, key=lambda b: (float(b.rstrip("af")), b))
    if not allow_suffix:
        assert not any(b.endswith(("a", "f")) for b in bases)  # what DeepSpeed's int() parser needs
    assert {a.rstrip("af") for a, _ in items} == {b.rstrip("af") for b in bases}
