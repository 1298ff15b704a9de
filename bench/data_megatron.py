"""Megatron-LM's own data code, loaded from a source checkout, for interoperability checks and benchmarks.

The checkout is found through ``MEGATRON_LM_SRC`` (or ``--src``); nothing of it is copied here.
``megatron/__init__.py`` and ``megatron/core/__init__.py`` are not executed: they import the whole
model-parallel stack (and optional GPU packages such as triton). The two packages are entered as
bare namespaces instead and the dataset modules are imported from the real files, unchanged.
Megatron's ``helpers.cpp`` is compiled with g++/pybind11 for this interpreter into a directory the
caller owns (a temporary one), as Megatron's own Makefile would, minus ``python3-config``.

Run directly, it shows the interoperability checks and their results:

    MEGATRON_LM_SRC=path/to/Megatron-LM python bench/data_megatron.py
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
import types
from pathlib import Path


def megatron_src(explicit: str | None = None) -> Path | None:
    path = explicit or os.environ.get("MEGATRON_LM_SRC")
    if not path:
        return None
    root = Path(path)
    return root if (root / "megatron/core/datasets/indexed_dataset.py").is_file() else None


def enter_megatron(src: Path) -> None:
    """Make ``import megatron.core.datasets.*`` load the checkout's files without the package inits."""
    if "megatron.core" in sys.modules and getattr(sys.modules["megatron.core"], "__path__", None) == [str(src / "megatron/core")]:
        return
    for name, path in (("megatron", src / "megatron"), ("megatron.core", src / "megatron/core")):
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module
    import megatron.core.parallel_state  # noqa: F401  (breaks the utils <-> parallel_state import cycle)


def compile_megatron_helpers(src: Path, out_dir: Path):
    """Compile Megatron's helpers.cpp for this Python; return the module, registered as Megatron expects."""
    import pybind11

    ext = sysconfig.get_config_var("EXT_SUFFIX")
    target = Path(out_dir) / f"helpers_cpp{ext}"
    if not target.exists():
        cmd = ["g++", "-O3", "-Wall", "-shared", "-std=c++17", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
               f"-I{pybind11.get_include()}", str(src / "megatron/core/datasets/helpers.cpp"), "-o", str(target)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    spec = importlib.util.spec_from_file_location("megatron.core.datasets.helpers_cpp", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["megatron.core.datasets.helpers_cpp"] = module
    return module


class MinimalTokenizer:
    """What Megatron's GPTDataset reads from a tokenizer: eod, pad and an identity for the cache hash."""

    def __init__(self, eod: int, vocab_size: int):
        self.eod, self.pad, self.vocab_size = eod, -1, vocab_size
        self.unique_identifiers = {"class": "MinimalTokenizer", "eod": eod}


def megatron_gpt_datasets(src: Path, prefix, *, split: str, seq_length: int, num_samples, seed: int,
                          cache_dir: str, eod: int, vocab_size: int, weights=None):
    """Megatron's own (train, valid, test): GPTDatasets for one prefix, BlendedDatasets for several."""
    enter_megatron(src)
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, split=split, path_to_cache=cache_dir,
        blend=([prefix] if isinstance(prefix, str) else list(prefix), weights),
        tokenizer=MinimalTokenizer(eod, vocab_size), reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, mid_level_dataset_surplus=0.005,
    )
    _single_process_group()
    return BlendedMegatronDatasetBuilder(GPTDataset, list(num_samples), lambda: True, config).build()


def _single_process_group() -> None:
    """Released megatron-core (0.16) asks torch.distributed for the rank when it caches blended
    indices; give it a one-process gloo group, as a single-GPU Megatron run has."""
    import torch.distributed as dist

    if dist.is_available() and not dist.is_initialized():
        with tempfile.NamedTemporaryFile(prefix="gptforge-pg-") as store:
            dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)


def _demo(src: Path) -> int:
    import numpy as np

    from gptforge.data.default_corpus import prepare_default
    from gptforge.data.gpt_dataset import build_gpt_datasets
    from gptforge.data.indexed import IndexedDataset as Ours

    enter_megatron(src)
    from megatron.core.datasets.indexed_dataset import IndexedDataset as Theirs

    with tempfile.TemporaryDirectory() as tmp:
        paths = prepare_default(Path(tmp) / "corpus")
        ours, theirs = Ours(paths.prefix), Theirs(str(paths.prefix))
        same = len(ours) == len(theirs) and all(np.array_equal(ours[i], theirs[i]) for i in range(len(ours)))
        print(f"Megatron IndexedDataset reads gptforge's {paths.prefix.name}: {len(theirs)} sequences, identical tokens: {same}")
        compile_megatron_helpers(src, Path(tmp))
        kw = dict(split="949,50,1", seq_length=256, num_samples=(5000, 200, 20), seed=1234)
        mine = build_gpt_datasets(paths.prefix, cache_dir=Path(tmp) / "ours", **kw)
        meg = megatron_gpt_datasets(src, str(paths.prefix), cache_dir=str(Path(tmp) / "theirs"),
                                    eod=paths.manifest["eod_id"], vocab_size=paths.manifest["tokenizer_vocab_size"], **kw)
        for name, a, b in zip(("train", "valid", "test"), mine, meg):
            equal = all(np.array_equal(a[i], b[i]["tokens"].numpy().tolist() + [int(b[i]["labels"][-1])]) for i in range(len(a)))
            print(f"{name}: gptforge {len(a)} samples, Megatron GPTDataset {len(b)}; first {len(a)} samples identical: {equal}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", help="Megatron-LM checkout (default: $MEGATRON_LM_SRC)")
    found = megatron_src(parser.parse_args().src)
    if found is None:
        sys.exit("Megatron-LM source not found: set MEGATRON_LM_SRC or pass --src")
    sys.exit(_demo(found))
