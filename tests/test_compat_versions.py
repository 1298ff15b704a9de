"""Version parsing: every pasted form is read, and the canonical form round-trips."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from gptforge.compat import (
    CudaVersion,
    DriverVersion,
    VersionError,
    format_cc,
    gpu_cc,
    parse_arch,
    parse_cc,
    parse_cuda,
    parse_cudnn,
    parse_driver,
    parse_gcc,
    parse_python,
    parse_torch,
    validate_cc,
)
from gptforge.compat.arches import Arch, parse_arch_list
from gptforge.compat.facts import facts
from gptforge.compat.gpus import UnknownGpu, _table, gpu_candidates
from gptforge.core.gpus import words

FAST = settings(max_examples=examples(150), deadline=None)

drivers = st.builds(
    lambda major, minor, patch, n: DriverVersion((major, minor, patch)[:n]),
    st.integers(100, 999), st.integers(0, 199), st.integers(0, 99), st.integers(1, 3),
)
cudas = st.builds(CudaVersion, st.integers(7, 19), st.integers(0, 9), st.none() | st.integers(0, 9))
gcc_versions = st.lists(st.integers(0, 40), min_size=1, max_size=3).map(
    lambda parts: ".".join(str(p) for p in [max(parts[0], 3)] + parts[1:]))


# --- law: parsing round-trips, format by format ------------------------------------------------

@FAST
@given(drivers)
def test_driver_round_trips(driver):
    assert parse_driver(str(driver)) == driver
    assert str(parse_driver(str(driver))) == str(driver)


@FAST
@given(cudas)
def test_cuda_round_trips_dotted_tag_and_encoded(cuda):
    assert parse_cuda(str(cuda)) == cuda
    assert parse_cuda(cuda.tag) == cuda.release
    assert parse_cuda(str(cuda.encoded)) == cuda.release


@FAST
@given(st.integers(1, 3), st.integers(0, 30), st.integers(0, 9), st.none() | cudas | st.just("cpu"))
def test_torch_round_trips(major, minor, patch, build):
    text = f"{major}.{minor}.{patch}"
    if build == "cpu":
        text += "+cpu"
    elif build is not None:
        text += f"+{build.tag}"
    parsed = parse_torch(text)
    assert str(parsed) == text
    assert parsed.release == f"{major}.{minor}"
    if isinstance(build, CudaVersion):
        assert parsed.cuda == build.release


@FAST
@given(gcc_versions)
def test_gcc_round_trips_keeping_its_components(text):
    assert str(parse_gcc(text)) == text


@FAST
@given(st.integers(8, 9), st.integers(0, 30), st.integers(0, 9))
def test_cudnn_encoded_matches_dotted(major, minor, patch):
    minor = minor if major >= 9 else minor % 10
    encoded = major * 10000 + minor * 100 + patch if major >= 9 else major * 1000 + minor * 100 + patch
    assert parse_cudnn(str(encoded)) == parse_cudnn(f"{major}.{minor}.{patch}")


@FAST
@given(st.sampled_from(sorted({a.cc for a in facts().known_arches})), st.sampled_from(["", "a", "f"]))
def test_cc_and_arch_round_trip(cc, suffix):
    assert parse_cc(format_cc(cc)) == cc
    assert parse_cc(f"sm_{cc[0]}{cc[1]}") == cc
    arch = Arch(cc[0], cc[1], suffix)
    assert parse_arch(str(arch)) == arch
    assert parse_arch(arch.sm) == arch


# --- examples --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text, canonical",
    [("580.65.06", "580.65.06"), ("580.65.6", "580.65.06"), ("570.26", "570.26"), ("535.104.05", "535.104.05")],
)
def test_driver_examples(text, canonical):
    assert str(parse_driver(text)) == canonical


def test_driver_compares_numerically():
    assert parse_driver("535.104.05") > parse_driver("535.54.03")
    assert parse_driver("570.26") < parse_driver("570.124.06")
    # a branch stands for its newest release: a floor inside the branch counts as met
    assert parse_driver("580") > parse_driver("580.65.06")
    assert parse_driver("580") < parse_driver("590.44.01")
    assert parse_driver("11040").reports_cuda == parse_cuda("11.4")
    assert parse_driver("9010").reports_cuda == parse_cuda("9.1")  # before CUDA 10 torch prints four digits


@pytest.mark.parametrize(
    "text, expected",
    [("12.4", CudaVersion(12, 4)), ("12.4.1", CudaVersion(12, 4, 1)), ("cu126", CudaVersion(12, 6)),
     ("cu92", CudaVersion(9, 2)), ("cu130", CudaVersion(13, 0)), ("12080", CudaVersion(12, 8)),
     ("11020", CudaVersion(11, 2)), ("CU118", CudaVersion(11, 8))],
)
def test_cuda_examples(text, expected):
    assert parse_cuda(text) == expected


def test_torch_examples():
    t = parse_torch("2.11.0+cu130")
    assert (str(t.version), t.cuda, t.local) == ("2.11.0", CudaVersion(13, 0), "cu130")
    assert parse_torch("2.13.0+cpu").is_cpu
    assert parse_torch("2.13.0").cuda is None


@pytest.mark.parametrize("text", ["13", "13.2", "13.2.0"])
def test_gcc_examples(text):
    assert parse_gcc(text).major == 13


def test_cudnn_examples():
    assert str(parse_cudnn("91002")) == "9.10.2"
    assert str(parse_cudnn("8902")) == "8.9.2"
    assert str(parse_cudnn("9.10.2.21")) == "9.10.2.21"


def test_arch_list_parsing():
    sass, ptx = parse_arch_list("8.0;9.0a 12.0+PTX")
    assert [str(a) for a in sass] == ["8.0", "9.0a", "12.0"]
    assert [str(a) for a in ptx] == ["12.0"]


@pytest.mark.parametrize(
    "parse, text",
    [(parse_driver, "banana"), (parse_driver, "580.65.06.1"), (parse_cuda, "twelve"), (parse_cuda, "12345"),
     (parse_torch, "latest"), (parse_torch, "2.11.0+cu13x"), (parse_gcc, "gcc-13"), (parse_gcc, "1.2"),
     (parse_python, "2.7"), (parse_cudnn, "9"), (parse_cc, "9.0.0"), (validate_cc, "99.1"), (parse_arch, "9.0z"),
     # digits of other scripts (str.isdigit() and int() accept them, versions do not)
     (parse_driver, "５８０.６５.０６"), (parse_cuda, "１２.４"), (parse_gcc, "１３"), (parse_python, "３.１２"),
     (parse_cudnn, "９１００２"), (parse_cc, "９.０"), (parse_arch, "９.０a"),
     # encoded cuDNN versions outside what torch.backends.cudnn.version() returns
     (parse_cudnn, "0000"), (parse_cudnn, "123456789")],
)
def test_bad_input_raises_version_error(parse, text):
    with pytest.raises(VersionError):
        parse(text)


@FAST
@given(st.text(max_size=12))
def test_parsers_raise_only_version_error_and_quote_the_input_on_one_line(text):
    for parse in (parse_driver, parse_cuda, parse_torch, parse_gcc, parse_python, parse_cudnn, parse_cc, parse_arch):
        try:
            parse(text)
        except VersionError as err:
            assert "\n" not in str(err)


# --- GPU names ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "name, cc",
    [("H100", (9, 0)), ("NVIDIA H100 80GB HBM3", (9, 0)), ("A100-SXM4-40GB", (8, 0)), ("RTX 4090", (8, 9)),
     ("nvidia geforce rtx 4090", (8, 9)), ("NVIDIA RTX 6000 Ada Generation", (8, 9)), ("Quadro RTX 6000", (7, 5)),
     ("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0)), ("Tesla V100-SXM2-16GB", (7, 0)),
     ("NVIDIA L40S", (8, 9)), ("NVIDIA L4", (8, 9)), ("NVIDIA A10G", (8, 6)), ("Tesla T4", (7, 5)),
     ("NVIDIA GH200 480GB", (9, 0)), ("NVIDIA B200", (10, 0)), ("NVIDIA GeForce RTX 5090", (12, 0))],
)
def test_gpu_names(name, cc):
    assert gpu_cc(name) == cc


@FAST
@given(st.sampled_from(_table()), st.sampled_from(["{}", "NVIDIA {}", "{} 80GB", "nvidia {} pcie"]),
       st.booleans())
def test_every_table_name_resolves_to_its_cc(row, pattern, upper):
    # law: a table name, in any case and with vendor / memory words around it, stands for its own CC, and for
    # another only where it is part of a longer table name of that CC ('TITAN X' of 'GTX TITAN X')
    _, cc, label = row
    name = pattern.format(label)
    found = gpu_candidates(name.upper() if upper else name.lower())
    assert cc in found
    for other, labels in found.items():
        if other != cc:
            assert all(len(words(longer)) > len(words(label)) for longer in labels)
    if len(found) == 1:
        assert gpu_cc(name) == cc


@pytest.mark.parametrize("name, ccs", [
    ("TITAN X", {(5, 2), (6, 1)}), ("NVIDIA TITAN X", {(5, 2), (6, 1)}), ("TITAN X (Pascal)", {(6, 1)}),
    ("NVIDIA TITAN X (Pascal)", {(6, 1)}), ("GeForce GTX TITAN X", {(5, 2)}), ("NVIDIA GeForce GTX TITAN X", {(5, 2)}),
    ("RTX 6000", {(7, 5), (8, 9)}), ("Quadro RTX 6000", {(7, 5)}), ("NVIDIA RTX 6000 Ada Generation", {(8, 9)}),
    ("RTX 3060", {(8, 6)}), ("A10", {(8, 6)}), ("A10G", {(8, 6)}), ("GTX 1660", {(7, 5)}),
])
def test_a_name_several_products_share_stands_for_each(name, ccs):
    # nvidia-smi prints 'TITAN X (Pascal)' (6.1) and 'GeForce GTX TITAN X' (5.2), never a bare 'TITAN X'; 'RTX 6000'
    # is the Quadro RTX 6000 (7.5) or the RTX 6000 Ada (8.9); a laptop and a desktop RTX 3060 share 8.6
    assert set(gpu_candidates(name)) == ccs
    if len(ccs) > 1:
        with pytest.raises(VersionError, match="ambiguous"):
            gpu_cc(name)


@pytest.mark.parametrize("name", ["banana", "Radeon RX 7900", ""])
def test_unknown_gpu(name):
    with pytest.raises(VersionError):
        gpu_cc(name)


@pytest.mark.parametrize("name, cc", [
    ("RTX3090", (8, 6)), ("rtx3090", (8, 6)), ("RTX4090", (8, 9)), ("4090", (8, 9)), ("GeForce 4090", (8, 9)),
    ("3090", (8, 6)), ("3090 Ti", (8, 6)), ("RTX3090Ti", (8, 6)), ("A100SXM4 40GB", (8, 0)), ("GH200", (9, 0)),
    ("H20", (9, 0)), ("Quadro 6000", (2, 0)), ("GTX960", (5, 2)),
])
def test_names_typed_without_spaces_or_series_resolve(name, cc):
    # a user writes 'RTX3090' (MeMOTR#6, cutlass#258) or the bare model number '4090': one product, one CC
    assert gpu_cc(name) == cc


@pytest.mark.parametrize("name", ["GTX 960M", "GTX960M"])
def test_a_letter_after_the_number_names_another_product(name):
    # the GTX 960M is a Maxwell GM107 (CC 5.0), the GTX 960 a GM206 (CC 5.2): the suffix is not dropped
    with pytest.raises(UnknownGpu):
        gpu_candidates(name)


@pytest.mark.parametrize("number, labels", [
    ("6000", {"Quadro 6000", "RTX 6000", "RTX 6000 Ada", "RTX PRO 6000"}),
    ("100", {"A100", "H100", "V100", "P100"}),
])
def test_a_bare_number_several_products_carry_is_refused_naming_them(number, labels):
    with pytest.raises(UnknownGpu) as refused:
        gpu_candidates(number)
    assert all(label in str(refused.value) for label in labels)


_GLUED = r"(?<=[A-Za-z])(?=[0-9])|(?<=[0-9])(?=[A-Za-z]{2})"


def _spelled(label: str, data: st.DataObject) -> str:
    """The table name as a user may type it: any case; each space written as one or two spaces, '-' or '_'; each
    boundary of a series and its number ('RTX' '3090') or of a number and a word after it ('3090' 'Ti') as nothing, a
    space or '-'."""
    out = []
    for i, word in enumerate(label.split()):
        parts = re.split(_GLUED, word)
        for j, part in enumerate(parts):
            if i or j:
                joints = ["", " ", "-"] if j else [" ", "  ", "-", "_"]
                out.append(data.draw(st.sampled_from(joints)))
            out.append("".join(c.upper() if data.draw(st.booleans()) else c.lower() for c in part))
    return "".join(out)


def _resolve(name: str):
    try:
        return gpu_candidates(name)
    except UnknownGpu as err:
        return type(err)


@FAST
@given(st.sampled_from(_table()), st.data())
def test_spacing_and_case_variants_of_every_table_name_resolve_alike(row, data):
    # law: 'RTX 3090', 'rtx3090', 'RTX-3090' and 'Rtx 3090' stand for the same CCs (or are refused alike)
    _, _, label = row
    assert _resolve(_spelled(label, data)) == _resolve(label)
