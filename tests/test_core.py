"""The core's values are read one way wherever they come from."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gptforge.compat.gpus import gpu_cc
from gptforge.core.versions import CudaVersion, cuda_release, parse_cc, parse_cuda
from gptforge.data.gpt_dataset import build_gpt_datasets
from gptforge.data.indexed_writer import IndexedDatasetWriter
from gptforge.errors import UsageError
from gptforge.links.libversion import Reading
from gptforge.probe.cudart import format_runtime_version
from gptforge.train.config import load_config, validate
from gptforge.train.peaks import load_table, lookup

cuda_versions = st.builds(CudaVersion, st.integers(7, 99), st.integers(0, 9))


@given(cuda_versions)
def test_the_runtime_number_reads_back_the_same_everywhere(cuda):
    """cudaRuntimeGetVersion's integer: the parser, the probe and the links' reading agree with the encoder."""
    number = cuda.encoded
    assert CudaVersion.from_encoded(number) == cuda
    assert parse_cuda(str(number)) == cuda
    assert format_runtime_version(number) == str(cuda)
    assert Reading("libcudart.so", (number,)).version == (cuda.major, cuda.minor)


@given(st.integers(1, 12), st.integers(0, 9))
def test_compute_capability_spellings_parse_to_one_tuple(major, minor):
    assert parse_cc(f"{major}.{minor}") == parse_cc(f"sm_{major}{minor}") == (major, minor)


def test_a_split_with_a_word_in_it_is_refused_by_the_data_set_and_the_config_alike(tmp_path):
    """'949,abc,1' once read as a two-way split in the data pipeline while the config refused it."""
    prefix = tmp_path / "tokens"
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        writer.add_documents([np.arange(40) for _ in range(5)])
    with pytest.raises(UsageError) as data_err:
        build_gpt_datasets(str(prefix), split="949,abc,1", seq_length=8, num_samples=(4, 4, 4), cache_dir=tmp_path / "c")
    cfg, _ = load_config("gpt2-tiny", ["split=949,abc,1"])
    with pytest.raises(UsageError) as config_err:
        validate(cfg)
    wrong = "'949,abc,1' is not comma-separated numbers (e.g. 949,50,1)"
    assert data_err.value.one_line() == f"--split: {wrong}"
    assert config_err.value.one_line() == f"split: {wrong}"


@pytest.mark.parametrize("device_name,row_name", [
    ("nvidia h100 pcie", "H100 PCIe"), ("NVIDIA-H100-NVL", "H100 NVL"), ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA GH200 480GB", "GH200"), ("NVIDIA A100-SXM4-80GB", "A100"),
])
def test_the_peak_table_and_the_cc_table_read_a_gpu_name_by_one_rule(device_name, row_name):
    """The peak table matched substrings, case and all ('GH200' found 'H200'); both now match whole words."""
    peaks = {row["match"]: row["bf16_tflops"] * 1e12 for row in load_table()}
    assert lookup(device_name).bf16_flops == peaks[row_name]
    assert gpu_cc(device_name) == gpu_cc(row_name)


@pytest.mark.parametrize("pattern", ["{}", "NVIDIA {}", "{} 80GB", "NVIDIA {} (rev a1)"])
@pytest.mark.parametrize("upper", [True, False])
def test_every_peak_row_resolves_under_the_spellings_the_cc_table_accepts(pattern, upper):
    for row in load_table():
        name = pattern.format(row["match"])
        name = name.upper() if upper else name.lower()
        assert lookup(name).source == row["source"]
        assert gpu_cc(name) == gpu_cc(row["match"])


@given(st.integers(1, 20), st.integers(0, 9), st.one_of(st.none(), st.integers(0, 999)))
def test_cuda_release_is_major_minor_of_any_printed_version(major, minor, patch):
    text = f"{major}.{minor}" if patch is None else f"{major}.{minor}.{patch}"
    assert cuda_release(text) == CudaVersion(major, minor)


@pytest.mark.parametrize("text", [None, "", "abc", "12", "twelve.four"])
def test_cuda_release_of_what_is_no_version_is_none(text):
    assert cuda_release(text) is None
