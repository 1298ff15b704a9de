"""The core's values are read one way wherever they come from."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gptforge.core.versions import CudaVersion, parse_cc, parse_cuda
from gptforge.links.libversion import Reading
from gptforge.probe.cudart import format_runtime_version

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
