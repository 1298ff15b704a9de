"""The host runtimes (glibc, libstdc++), torch's C++ ABI per build, older torch builds, and their laws."""

from __future__ import annotations

import tomllib

from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

from conftest import examples
from gptforge.compat import Combination, check
from gptforge.compat.facts import facts, load_table
from gptforge.compat.host_libs import gcc_glibcxx, manylinux_glibc, parse_glibc, parse_glibcxx
from compatgen import extensions, refresh
from gptforge.compat.wheels import parse_wheel_name
from gptforge.core.versions import VersionError, parse_cuda


def errors(**fields) -> set[str]:
    return {f.code for f in check(Combination(**fields)) if f.severity.value == "error"}


# --- glibc and libstdc++ ---------------------------------------------------------------------------


def test_torch_wheels_from_2_7_need_glibc_2_28():
    assert errors(torch="2.7.0", glibc="2.17") == {"glibc-too-old"}
    assert errors(torch="2.7.0", glibc="2.28") == set()
    assert errors(torch="2.6.0", glibc="2.17") == set()  # PyPI's 2.6.0 is a manylinux1 wheel
    assert errors(torch="2.6.0+cu126", glibc="2.17") == {"glibc-too-old"}  # the manylinux_2_28 builds


def test_torch_glibc_floor_is_what_its_libraries_need_where_the_tag_says_less():
    """The manylinux1 tag of PyPI's older torch wheels names glibc 2.5; their libraries need GLIBC_2.17."""
    assert errors(torch="1.2.0", glibc="2.12") == {"glibc-too-old"}
    assert errors(torch="2.5.1", glibc="2.12") == {"glibc-too-old"}
    assert errors(torch="1.2.0", glibc="2.17") == set()
    assert errors(torch="2.5.1", glibc="2.17") == set()  # GLIBC_2.17 is the newest its libraries (and libcurand) need
    assert all(facts().torch_glibc[v] >= Version(row["glibc"]) for row in load_table("torch_python.toml")["wheel"]
               if "glibc" in row and (v := row["version"]) in facts().torch_glibc)


def test_wheel_glibc_floor_comes_from_its_tag_or_its_release_runner():
    assert errors(glibc="2.17", wheels=("transformer_engine_cu12-2.5.0-py3-none-manylinux_2_28_x86_64.whl",)) \
        == {"glibc-too-old"}
    flash = "flash_attn-2.5.8+cu122torch2.3cxx11abiFALSE-cp310-cp310-linux_x86_64.whl"  # built on ubuntu-20.04
    assert errors(glibc="2.27", wheels=(flash,), torch="2.3.0") == {"glibc-too-old"}
    assert errors(glibc="2.31", wheels=(flash,), torch="2.3.0") == set()
    newer = "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"  # ubuntu-22.04: seen to need 2.32
    assert errors(glibc="2.31", wheels=(newer,)) == {"glibc-too-old"}
    assert errors(glibc="2.32", wheels=(newer,)) == set()


def test_libstdcxx_older_than_the_extension_compilers_fails():
    assert errors(gcc="12", libstdcxx="GLIBCXX_3.4.29") == {"libstdcxx-too-old"}
    assert errors(gcc="11.4", libstdcxx="3.4.29") == set()
    assert errors(libstdcxx="3.4.19") == set()  # no compiler given: nothing built, nothing to judge


def test_torch_cudnn_given_is_compared_with_the_loaded_one():
    assert errors(torch_cudnn="8.9.2", cudnn="8.5.0") == {"cudnn-torch-mismatch"}
    assert errors(torch_cudnn="8.5.0", cudnn="8.9.2") == set()
    assert errors(torch="0.4.1", torch_cudnn="7.2.1", cudnn="7.3.0") == {"cudnn-torch-mismatch"}  # exact before 1.0
    assert errors(torch="1.7.1+cu102", torch_cudnn="7.6.5", cudnn="7.6.5") == set()


def test_new_flags_reject_bad_values():
    for bad in ("2", "2.x", "glibc", "2.31.1", ""):
        try:
            parse_glibc(bad)
        except VersionError:
            continue
        raise AssertionError(bad)
    assert parse_glibcxx("GLIBCXX_3.4.30") == parse_glibcxx("3.4.30") == Version("3.4.30")


# --- torch's ABI and older builds -------------------------------------------------------------------


def test_abi_per_build_and_ngc_source_builds():
    old = "flash_attn-2.7.4.post1+cu12torch2.7cxx11abiFALSE-cp310-cp310-linux_x86_64.whl"
    assert errors(torch="2.7.0+cu126", wheels=(old,)) == {"wheel-abi-mismatch"}
    ngc = "flash_attn-2.5.8+cu122torch2.3cxx11abiFALSE-cp310-cp310-linux_x86_64.whl"
    assert errors(torch="2.3.0a0+40ec155e58.nv24.3", wheels=(ngc,)) == {"wheel-abi-mismatch", "wheel-torch-mismatch"}
    # the ABI fits, but the wheel was built against the released 2.3, not this build from a checkout
    assert errors(torch="2.3.0a0+40ec155e58.nv24.3", wheels=(ngc.replace("FALSE", "TRUE"),)) == {"wheel-torch-mismatch"}


def test_abi_rows_agree_with_the_manylinux_tag_of_pypi_wheels():
    """torch's PyPI wheels use the C++11 ABI exactly when they are manylinux_2_28 builds (glibc >= 2.28)."""
    from gptforge.compat.facts import release_row

    rows = [r for r in load_table("torch_abi.toml")["abi"] if "cuda" not in r]
    compared = 0
    for version, glibc in facts().torch_glibc.items():
        row = release_row(rows, Version(version))
        if row is not None and Version(version).major >= 1:
            compared += 1
            assert row["cxx11_abi"] == (glibc >= Version("2.28")), (version, glibc)
    assert compared > 40


def test_torch_before_1_3_is_judged():
    assert errors(torch="1.2.0", ccs=((3, 0),)) == {"gpu-arch-not-in-torch"}  # PyPI's 1.2.0 cubins start at sm_35
    assert errors(torch="1.2.0", ccs=((7, 5),)) == set()
    assert errors(torch="1.0.1", ccs=((7, 5),)) == set()  # its sm_70 cubins run on 7.5
    assert errors(torch="1.1.0", ccs=((8, 0),)) == {"gpu-arch-not-in-torch"}
    assert errors(torch="0.4.1", torch_cuda="9.2", ccs=((8, 6),)) == {"gpu-arch-not-in-torch"}
    assert errors(torch="1.2.0", python="3.8") == {"python-unsupported"}
    assert errors(torch="1.2.0", driver="384.81") == {"driver-too-old"}  # PyPI's 1.2.0 is a CUDA 10.0 build
    assert errors(torch="1.0.0", driver="384.81") == set()  # PyPI's 1.0.0 is a CUDA 9.0 build
    for version in ("0.4.1", "1.0.0", "1.1.0", "1.2.0"):
        assert "torch-unknown" not in {f.code for f in check(Combination(torch=version))}


def test_a_pypi_wheel_is_judged_by_the_arches_it_was_built_for():
    """PyPI's cu102 wheels of 1.3.1 to 1.12 start at sm_37 (the pytorch channel's packages carry sm_35 too, so an
    untagged 1.8.1 is only warned about: test_compat_torch_builds.py)."""
    assert errors(torch="1.12.1+cu102", ccs=((3, 5),)) == {"gpu-arch-not-in-torch"}
    assert errors(torch="1.8.1", ccs=((3, 7),)) == set()
    assert errors(torch="1.8.1", torch_cuda="10.2", ccs=((3, 5),)) == set()  # may be the conda package
    assert errors(torch="1.3.0", ccs=((3, 5),)) == set()  # 1.3.0's wheel still had sm_35


def test_torch_1_5_extensions_need_a_cxx14_nvcc():
    # (every published build of 1.4 and 1.5 is for CUDA 9.2 or later: nvcc-torch-mismatch as well)
    assert "cxx-standard-unsupported" in errors(torch="1.5.0", cuda="8.0")
    assert "cxx-standard-unsupported" not in errors(torch="1.4.0", cuda="8.0")  # C++11 until 1.4
    assert errors(torch="1.5.0", cuda="9.2") == set()


def test_nvcc_of_a_major_no_build_of_the_torch_release_has_is_an_error():
    """NVIDIA/apex#1810: nvcc 12.4 with torch 1.7.1, whose builds are for CUDA 9.2 to 11.0."""
    assert errors(torch="1.7.1", cuda="12.4") == {"nvcc-torch-mismatch"}
    assert errors(torch="1.7.1", cuda="11.0") == set()  # the cu110 build is one of them
    assert "nvcc-torch-mismatch" not in errors(torch="2.5.1", cuda="12.4")


def test_older_torch_builds_are_judged():
    assert errors(ccs=((8, 0),), torch="1.10.1+cu102") == {"gpu-arch-not-in-torch"}
    assert errors(ccs=((8, 6),), torch="1.7.1+cu110") == set()  # sm_80 runs on 8.6
    assert errors(ccs=((8, 6),), torch="1.5.1+cu101") == {"gpu-arch-not-in-torch"}  # CUDA 10.1 targets up to 7.5
    assert errors(driver="435.21", torch="1.7.1") == {"driver-too-old"}  # PyPI's 1.7.1 is the CUDA 10.2 build
    assert errors(ccs=((8, 6),), torch="1.7.1", cuda="11.0", torch_cuda_arch_list_env="8.0") == set()  # build unknown
    assert errors(ccs=((8, 0),), torch="1.6.0") == {"gpu-arch-not-in-torch"}  # no arch list: CUDA 10.2 tops at 7.5
    assert errors(ccs=((8, 0),), torch_arch_list=("sm_37", "sm_75", "compute_37")) == {"gpu-arch-not-in-torch"}
    assert errors(ccs=((12, 1),), torch_arch_list=("sm_90", "sm_120", "compute_120")) == set()


# --- the tables made from artifacts ---------------------------------------------------------------------


def test_extension_tables_equal_the_refresh_output_of_their_recorded_inputs():
    for output, make, source in ((extensions.FLASH_OUTPUT, extensions.flash_attn_table,
                                  extensions.FLASH_INPUT),
                                 (extensions.TE_OUTPUT, extensions.te_table, extensions.TE_INPUT)):
        assert output.read_text(encoding="utf-8") == make(source.read_text(encoding="utf-8"))
    assert refresh.OUTPUT.read_text(encoding="utf-8") == refresh.python_table(refresh.recorded_filenames())


def test_a_plain_cuda_program_on_a_minor_compat_driver_needs_its_ptx_jit_compiled():
    """nvbandwidth builds with CMake's default arch (nvcc's: sm_75 for 13.x): on an H100 with a 13.0 driver, the
    13.2 PTX cannot be JIT-compiled. A torch extension builds the GPU's own arch, so there it stays a warning."""
    plain = dict(ccs=((9, 0),), driver="580.126.09", cuda="13.2")
    assert errors(**plain) == {"ptx-newer-than-driver"}
    own = str(facts().toolkit_driver(parse_cuda("13.2")))
    assert errors(**{**plain, "driver": own}) == set()
    assert errors(**plain, torch="2.11.0+cu130") == set()
    assert errors(**plain, torch_cuda_arch_list_env="9.0") == set()
    assert errors(ccs=((7, 5),), driver="580.126.09", cuda="13.2") == set()  # sm_75 SASS runs on it


def test_te_needs_a_driver_of_its_cuda_not_only_the_minor_compat_floor():
    """"NVIDIA Driver supporting CUDA 12.1 or later": 12.1's own driver, above CUDA 12's minor-compat floor."""
    assert errors(transformer_engine="2.5", driver="525.60.13", ccs=((9, 0),)) == {"te-unsupported"}
    assert errors(transformer_engine="2.5", driver="535.104.05", ccs=((9, 0),)) == set()
    assert errors(transformer_engine="1.5", driver="520.61.05", ccs=((9, 0),)) == set()  # 1.x: CUDA 11.8's driver


def test_te_python_limits_come_from_requires_python():
    assert errors(transformer_engine="2.4", python="3.13") == {"te-unsupported"}
    assert errors(transformer_engine="2.9.0", python="3.9") == {"te-unsupported"}
    assert errors(transformer_engine="2.9.0", python="3.12") == set()
    rows = tomllib.loads(extensions.TE_OUTPUT.read_text(encoding="utf-8"))["release"]
    assert all(row["source"].startswith("https://pypi.org/project/transformer-engine/") for row in rows)


# --- laws -----------------------------------------------------------------------------------------------

_versions = st.tuples(st.integers(0, 9), st.integers(0, 20), st.integers(0, 9))


@given(major=st.integers(1, 3), minor=st.integers(0, 40))
def test_manylinux_tag_round_trips_to_its_glibc(major, minor):
    assert manylinux_glibc(f"manylinux_{major}_{minor}_x86_64") == Version(f"{major}.{minor}")
    assert parse_glibc(f"{major}.{minor}") == Version(f"{major}.{minor}")


@given(version=_versions, cuda=st.sampled_from(["cu118", "cu121", "cu12", "cu11", "cu130", "cu13"]),
       torch=st.tuples(st.integers(1, 2), st.integers(0, 15)), abi=st.booleans(),
       python=st.sampled_from(["cp38", "cp310", "cp312", "cp313"]))
def test_flash_attn_wheel_names_round_trip(version, cuda, torch, abi, python):
    local = f"{cuda}torch{torch[0]}.{torch[1]}cxx11abi{'TRUE' if abi else 'FALSE'}"
    name = f"flash_attn-{'.'.join(map(str, version))}+{local}-{python}-{python}-linux_x86_64.whl"
    build = parse_wheel_name(name)
    assert build.project == "flash-attn"
    assert build.version.public == Version(".".join(map(str, version))).public
    assert build.torch == torch and build.cxx11_abi is abi
    assert build.cuda_major == int(cuda[2:4])
    assert {tag.interpreter for tag in build.tags} == {python}


@settings(max_examples=examples(40), deadline=None)
@given(low=st.integers(12, 40), high=st.integers(12, 40),
       torch=st.sampled_from(["1.2.0", "2.5.1", "2.6.0", "2.6.0+cu126", "2.7.0", "2.13.0"]))
def test_a_newer_glibc_never_adds_an_error(low, high, torch):
    low, high = sorted((low, high))
    assert errors(torch=torch, glibc=f"2.{high}") <= errors(torch=torch, glibc=f"2.{low}")


@settings(max_examples=examples(40), deadline=None)
@given(low=st.integers(19, 34), high=st.integers(19, 34), gcc=st.integers(5, 15))
def test_a_newer_libstdcxx_never_adds_an_error(low, high, gcc):
    low, high = sorted((low, high))
    assert errors(gcc=str(gcc), libstdcxx=f"3.4.{high}") <= errors(gcc=str(gcc), libstdcxx=f"3.4.{low}")


def test_a_newer_gcc_never_needs_an_older_glibcxx():
    rows = load_table("host_libs.toml")["glibcxx"]
    needs = [gcc_glibcxx(Version(row["gcc"])) for row in rows]
    assert needs == sorted(needs)
    assert all(gcc_glibcxx(Version(str(major))) <= gcc_glibcxx(Version(f"{major}.4")) for major in range(5, 16))


def test_torch_abi_switches_once():
    """The PyPI builds' ABI goes from pre-C++11 to C++11 once, and never back."""
    rows = sorted((r for r in load_table("torch_abi.toml")["abi"] if "cuda" not in r),
                  key=lambda r: Version(r["versions"].split(",")[0].lstrip(">=")))
    flags = [r["cxx11_abi"] for r in rows]
    assert flags == sorted(flags) and flags[0] is False and flags[-1] is True


# --- the live machine -------------------------------------------------------------------------------


def test_the_probe_reads_this_hosts_glibc_and_libstdcxx():
    """The probe's glibc is the running one, and the GLIBCXX it reads from the libstdc++ bytes is the
    newest that file defines: the libstdc++ gcc 4.8.3 and later build against defines at least 3.4.19."""
    import platform

    from gptforge.probe.host_libs import glibcxx_versions, probe_host

    host = probe_host()
    name, version = platform.libc_ver()
    if name == "glibc":
        assert host["glibc"] == version
    if host["libstdcxx_path"]:
        assert host["libstdcxx"] == glibcxx_versions(host["libstdcxx_path"])[-1]
        assert parse_glibcxx(host["libstdcxx"]) >= Version("3.4.19")


def test_glibcxx_versions_are_read_from_the_files_bytes(tmp_path):
    from gptforge.probe.host_libs import glibcxx_versions

    lib = tmp_path / "libstdc++.so.6"
    lib.write_bytes(b"\x7fELF junk GLIBCXX_3.4\x00 GLIBCXX_3.4.9\x00 GLIBCXX_3.4.30\x00 GLIBCXX_3.4.28\x00 "
                    b"GLIBCXX_DEBUG_MESSAGE_LENGTH\x00")
    assert glibcxx_versions(str(lib)) == ["3.4", "3.4.9", "3.4.28", "3.4.30"]
    assert glibcxx_versions(str(tmp_path / "absent")) == []


cudnns = st.builds(lambda major, minor, patch: f"{major}.{minor}.{patch}", st.integers(5, 9), st.integers(0, 20),
                   st.integers(0, 9))
cudnn_torches = st.none() | st.sampled_from(["0.4.1", "1.0.1", "1.7.1+cu102", "2.1.2+cu121", "2.11.0+cu130"])


@settings(max_examples=examples(60), deadline=None)
@given(cudnns, cudnns, cudnn_torches)
def test_cudnn_runtime_against_compiled_follows_torchs_check(compiled, runtime, torch):
    """torch/backends/cudnn: another major always fails, an older minor fails in every release (cuDNN 9 too), a
    newer minor fails before torch 1.0 and before cuDNN 7; without --torch only what holds for every release errs."""
    (c_major, c_minor, _), (r_major, r_minor, _) = (tuple(map(int, v.split("."))) for v in (compiled, runtime))
    found = errors(torch=torch, torch_cudnn=compiled, cudnn=runtime) & {"cudnn-torch-mismatch"}
    before_1_0 = torch is not None and torch.startswith("0.")
    fails = r_major != c_major or r_minor < c_minor or (r_minor != c_minor and (before_1_0 or c_major < 7))
    assert bool(found) == fails, (compiled, runtime, torch)


def test_torch_headers_without_this_pointer_fail_under_gcc_5_as_nvcc_host_compiler():
    def found(**fields):
        return {f.code: f.severity.value for f in check(Combination(**fields)) if f.code == "torch-headers-gcc"}

    assert found(torch="1.5.0", cuda="10.1", gcc="5.4.0") == {"torch-headers-gcc": "error"}  # apex#820
    assert found(torch="1.5.1", cuda="10.1", gcc="5.4.0") == {}  # pytorch#37221 added `this->`
    assert found(torch="1.5", cuda="10.1", gcc="5.4.0") == {"torch-headers-gcc": "warning"}  # 1.5.0 only
    assert found(torch="1.9.1", cuda="11.1", gcc="5.4.0") == {}
    assert found(torch="1.11.0", cuda="11.1", gcc="5.4.0") == {"torch-headers-gcc": "error"}  # apex#1531
    assert found(torch="1.11.0", cuda="11.1", gcc="7.5.0") == {}
    assert found(torch="1.11.0", gcc="5.4.0") == {}  # no nvcc: no .cu file is compiled


@settings(max_examples=examples(60), deadline=None)
@given(st.sampled_from(["1.4.0", "1.5", "1.5.0", "1.5.1", "1.9.0", "1.10", "1.10.2", "1.12.1", "1.13.1", "2.0.1"]),
       st.integers(4, 13), st.integers(4, 13))
def test_a_newer_gcc_never_adds_the_torch_header_error(torch, gcc_a, gcc_b):
    low, high = sorted((gcc_a, gcc_b))

    def errors(gcc):
        return {f.code for f in check(Combination(torch=torch, cuda="10.2", gcc=f"{gcc}.1"))
                if f.severity.value == "error"}
    assert "torch-headers-gcc" not in errors(high) or "torch-headers-gcc" in errors(low)
