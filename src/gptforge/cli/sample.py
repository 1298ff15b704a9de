"""CLI for `gptforge sample`: argument parsing only."""

from __future__ import annotations

import json
from pathlib import Path

from gptforge.cli.train import require_torch


def register(subparsers, groups) -> None:
    s = subparsers.add_parser("sample", help="generate text from a training checkpoint",
                              description="generate text from a checkpoint (a run directory or one step_* directory)")
    s.add_argument("--checkpoint", type=Path, required=True, help="run directory, its checkpoints/ or a step_* directory")
    s.add_argument("--prompt", default="", help="text to continue (default: start of a document)")
    s.add_argument("--max-new-tokens", type=int, help="how many tokens to generate (default: 200, fewer where the "
                   "model's context ends sooner)")
    s.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    s.add_argument("--top-k", type=int, default=50, help="0: no top-k filter")
    s.add_argument("--seed", type=int, default=1234)
    s.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    s.add_argument("--json", action="store_true", help="print a JSON object instead of the text")
    s.set_defaults(func=run_sample)


def run_sample(args) -> int:
    from gptforge.train.sample_options import check_sampling

    check_sampling(args.max_new_tokens, args.temperature, args.top_k or None, args.seed, args.prompt)  # no torch import
    require_torch()
    from gptforge.train.sample import generate

    out = generate(args.checkpoint, args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                   top_k=args.top_k or None, seed=args.seed, device=args.device)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(out["prompt"] + out["completion"])
    return 0
