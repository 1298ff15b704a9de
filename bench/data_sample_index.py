"""Sample-index build time for a 1e9-token dataset: gptforge C++ vs gptforge NumPy vs Megatron's helpers.

    python bench/data_sample_index.py [--tokens 1e9] [--seq-length 2048] [--repeat 3]

Documents get lognormal lengths (mean about 1,000 tokens) until they hold the requested tokens;
the document index is one shuffled epoch, as GPTDataset builds it. Megatron's column needs its
source (``MEGATRON_LM_SRC`` or ``--megatron-src``): its helpers.cpp is compiled with g++/pybind11
for this Python in a temporary directory. All three results are checked equal. Writes
``data_sample_index.json`` to ``$GPTFORGE_BENCH_OUT`` when set.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from data_megatron import compile_megatron_helpers, megatron_src  # noqa: E402

from gptforge.build.helpers import build_helpers, load_helpers  # noqa: E402
from gptforge.data import sample_index as si  # noqa: E402


def make_inputs(tokens: int, seed: int = 0):
    rng = np.random.RandomState(seed)
    mean_doc = 1000
    sizes = np.maximum(1, rng.lognormal(np.log(mean_doc) - 0.5, 1.0, size=int(tokens / mean_doc * 1.2))).astype(np.int32)
    cut = int(np.searchsorted(np.cumsum(sizes, dtype=np.int64), tokens)) + 1
    sizes = sizes[:cut]
    doc_idx = rng.permutation(len(sizes)).astype(np.int32)
    return sizes, doc_idx, int(sizes.sum(dtype=np.int64))


def best_of(fn, repeat: int) -> tuple[float, np.ndarray]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=1e9)
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--megatron-src", help="Megatron-LM checkout (default: $MEGATRON_LM_SRC)")
    args = parser.parse_args()

    sizes, doc_idx, total = make_inputs(int(args.tokens))
    call = (sizes, doc_idx, args.seq_length, 1, total, True, 1)
    print(f"inputs: {len(sizes):,} documents, {total:,} tokens, seq_length {args.seq_length}, "
          f"{(total - 1) // args.seq_length:,} samples; best of {args.repeat}")
    build_helpers()
    ours = load_helpers()
    rows = []
    t_cpp, a = best_of(lambda: ours.build_sample_idx_int32(*call), args.repeat)
    rows.append(("gptforge C++ (helpers.cpp)", t_cpp, a))
    t_np, b = best_of(lambda: si.reference_build_sample_idx(*call), args.repeat)
    rows.append(("gptforge NumPy reference", t_np, b))
    src = megatron_src(args.megatron_src)
    with tempfile.TemporaryDirectory() as tmp:
        if src is not None:
            theirs = compile_megatron_helpers(src, Path(tmp))
            t_meg, c = best_of(lambda: theirs.build_sample_idx_int32(*call), args.repeat)
            rows.append(("Megatron-LM helpers.cpp", t_meg, c))
        else:
            print("Megatron-LM source not found (MEGATRON_LM_SRC): its column is skipped")
    reference = rows[0][2]
    print(f"\n{'implementation':<30} {'seconds':>9} {'Mtokens/s':>10}  equal")
    for name, seconds, result in rows:
        equal = np.array_equal(result, reference)
        print(f"{name:<30} {seconds:>9.4f} {total / seconds / 1e6:>10.0f}  {equal}")
        if not equal:
            return 1
    report = {
        "tokens": total, "documents": len(sizes), "seq_length": args.seq_length, "repeat": args.repeat,
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "seconds": {name: round(seconds, 5) for name, seconds, _ in rows},
    }
    out = os.environ.get("GPTFORGE_BENCH_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "data_sample_index.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
