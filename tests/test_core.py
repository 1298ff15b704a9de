"""The core's values are read one way wherever they come from."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gptforge.core.versions import CudaVersion, parse_cc, parse_cuda
from gptforge.data.gpt_dataset import build_gpt_datasets
from gptforge.data.indexed import IndexedDatasetWriter
from gptforge.errors import UsageError
from gptforge.links.libversion import Reading
from gptforge.probe.cudart import format_runtime_version
from gptforge.train.config import load_config, validate

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
