"""The tables the refresh script owns: made offline from recorded inputs, every row with its source,
and the hand-entered torch facts checked against them."""

from __future__ import annotations

import tomllib

from packaging.version import Version

from gptforge.compat import refresh
from gptforge.compat.facts import facts


def _generated(path) -> dict:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def test_conda_builds_table_equals_the_refresh_output_of_its_recorded_input():
    text = refresh.CONDA_INPUT.read_text(encoding="utf-8")
    assert refresh.CONDA_OUTPUT.read_text(encoding="utf-8") == refresh.conda_builds_table(text)


def test_every_generated_row_names_its_source():
    python_rows = _generated(refresh.OUTPUT)["wheel"]
    assert all(row["source"] == f"https://pypi.org/project/torch/{row['version']}/#files" for row in python_rows)
    builds = _generated(refresh.CONDA_OUTPUT)["build"]
    assert len(builds) > 50
    assert all(row["source"].startswith("https://github.com/moi90/pytorch_compute_capabilities/blob/") and
               row["source"].endswith("/table.md") and "/blob/main/" not in row["source"] for row in builds)


def test_conda_rows_are_read_from_the_package_names_and_cuobjdump_lists():
    text = ("<!-- recorded from https://example.org/blob/0123/table.md -->\n"
            "| pytorch-2.5.1-py3.12_cuda12.4_cudnn9.1.0_0    | sm_50, sm_90, sm_90a |\n"
            "| pytorch-2.5.1-py3.11_cuda12.4_cudnn9.1.0_0    | sm_50, sm_90, sm_90a |\n"
            "| pytorch-1.7.1-py3.9_cuda11.0.221_cudnn8.0.5_0 | sm_35, sm_80         |\n")
    rows = tomllib.loads(refresh.conda_builds_table(text))["build"]
    assert rows[0] == {"torch": "2.5.1", "cuda": "12.4", "cudnn": "9.1.0", "arches": "5.0 9.0 9.0a",
                       "packages": ["pytorch-2.5.1-py3.11_cuda12.4_cudnn9.1.0_0",
                                    "pytorch-2.5.1-py3.12_cuda12.4_cudnn9.1.0_0"],
                       "source": "https://example.org/blob/0123/table.md"}
    assert (rows[1]["cuda"], rows[1]["arches"]) == ("11.0", "3.5 8.0")


def test_hand_entered_cudnn_per_torch_build_agrees_with_the_packages():
    """torch.toml's bundled cuDNN per (release, CUDA) is the cuDNN the same release's packages carry."""
    builds = _generated(refresh.CONDA_OUTPUT)["build"]
    by_build: dict[tuple[str, str], set[str]] = {}
    for row in builds:
        release = ".".join(row["torch"].split(".")[:2])
        by_build.setdefault((release, row["cuda"]), set()).add(row["cudnn"])
    compared = 0
    for release, entry in facts().torch.items():
        for variant in entry.variants:
            packaged = by_build.get((release, str(variant.cuda.release)))
            if variant.cudnn is None or not packaged:
                continue
            compared += 1
            assert Version(".".join(str(p) for p in variant.cudnn.release[:3])) in {Version(c) for c in packaged}, \
                (release, variant.cuda, variant.cudnn, packaged)
    assert compared >= 15


def test_every_gpu_row_names_the_page_or_report_it_was_read_from():
    from gptforge.compat.facts import load_table

    rows = load_table("gpus.toml")["gpu"]
    nvidia = {"https://developer.nvidia.com/cuda-gpus", "https://developer.nvidia.com/cuda-legacy-gpus"}
    assert all(row["source"] in nvidia or row["source"].startswith("https://github.com/") for row in rows)
    assert not [row for row in rows if "third-party" in row.get("note", "") or "unverified" in row.get("note", "")]
