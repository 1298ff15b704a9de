"""CLI for `gptforge train`: argument parsing only."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from gptforge.errors import GptforgeError, UsageError

TRAIN_HELP = "pretrain a GPT-2 (embedded corpus by default); torchrun / deepspeed / srun launch it on many GPUs"
TRAIN_EPILOG = """\
examples:
  gptforge train                                   # tiny GPT on the embedded corpus, CPU or GPU
  gptforge train --config gpt2-124m data-path=data/owt_text_document tokenizer-type=gpt2
  gptforge train --config gpt2-tiny train-iters=500 lr=1e-3 --run-dir runs/try1
  gptforge train --run-dir runs/try1 --resume      # continue exactly where it stopped
  torchrun --nproc-per-node 8 -m gptforge train --config gpt2-124m --run-dir runs/124m
  deepspeed --no_local_rank --module gptforge train --config gpt2-124m --deepspeed zero2.json
  torchrun --nproc-per-node 8 -m gptforge train --config gpt2-350m --fsdp --run-dir runs/350m
overrides are Megatron-style config keys: key=value (see --list-keys); unknown keys are errors.
"""


def register(subparsers, groups) -> None:
    p = subparsers.add_parser("train", help=TRAIN_HELP, description=TRAIN_HELP, epilog=TRAIN_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter, intermixed=True)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. lr=3e-4 train-iters=200")
    p.add_argument("--config", default="gpt2-tiny", help="packaged config name (gpt2-tiny, gpt2-124m, "
                   "gpt2-124m-hopper, gpt2-350m, gpt2-774m, gpt2-1.5b) or a .toml path (default: gpt2-tiny)")
    p.add_argument("--run-dir", type=Path, help="where logs, checkpoints and the plot go "
                   "(default: runs/CONFIG-TIMESTAMP; runs/CONFIG under a distributed launcher)")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint in the run "
                   "directory (default: the newest runs/CONFIG* holding one)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: cuda when present")
    p.add_argument("--deepspeed", metavar="CONFIG", help="train with the DeepSpeed engine and this JSON config "
                   "(ZeRO stage, bf16/fp16); launch with the deepspeed launcher")
    p.add_argument("--fsdp", action="store_true", help="shard parameters, gradients and optimizer state over the "
                   "processes with PyTorch FSDP2; launch with torchrun")
    p.add_argument("--fsdp-unit", choices=("block", "model"), help="with --fsdp: model (default; the weights gathered "
                   "once per step, fewest collectives) or block (each block gathered when needed, the least memory)")
    p.add_argument("--json", action="store_true", help="logs to stderr, a JSON summary to stdout")
    p.add_argument("--list-configs", action="store_true", help="print the packaged configs and exit")
    p.add_argument("--list-keys", action="store_true", help="print every config key with its value in --config (and the overrides) and what it means, then exit")
    p.set_defaults(func=run_train)


def require_torch() -> None:
    """The package leaves torch to the environment, which brings the build for its CUDA (or the CPU one)."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as err:
        if err.name != "torch":
            raise
        raise GptforgeError("torch is not installed in this Python", "install the project's environment: pixi run -e cpu "
                            "gptforge train, or in this venv pip install --require-hashes -r envs/cpu/requirements.txt "
                            "(CPU; 'gptforge compat recommend' prints the line for this machine's GPU)") from None


def run_train(args) -> int:
    from rich.console import Console

    require_torch()
    from gptforge.train.config import list_keys, load_config, packaged_configs

    if args.list_configs:
        print("\n".join(packaged_configs()))
        return 0
    if args.fsdp and args.deepspeed:
        raise UsageError("--fsdp", "--fsdp and --deepspeed both given", "pick one sharding engine")
    if args.fsdp_unit and not args.fsdp:
        raise UsageError("--fsdp-unit", "given without --fsdp", "add --fsdp, or leave --fsdp-unit out")
    cfg, path = load_config(args.config, args.overrides)
    if args.list_keys:
        print(list_keys(cfg))
        return 0
    from gptforge.train.loop import RunOptions, train
    from gptforge.train.preempt import PREEMPTED_EXIT

    opts = RunOptions(run_dir=args.run_dir, config_name=Path(args.config).stem, resume=args.resume,
                      device=args.device, deepspeed=args.deepspeed,
                      fsdp=(args.fsdp_unit or "model") if args.fsdp else None)
    console = Console(stderr=args.json, soft_wrap=True)
    result = train(cfg, opts, console=console)

    code = 0 if result.stopped_at is None else PREEMPTED_EXIT
    if result.metrics is None:
        return code
    if args.json:
        json.dump(asdict(result), sys.stdout, indent=2, default=str)  # paths as text, notes as their fields
        sys.stdout.write("\n")
        return code
    if result.stopped_at is not None:
        console.print(f"\n[bold yellow]SIGTERM[/]: stopped after step {result.stopped_at}, saved in {result.last_checkpoint}; "
                      f"the same command with --resume continues the run (exit status {code})")
        return code
    console.print(f"\n[bold green]done[/]: {result.steps} steps{_validation_text(result)}")
    console.print(f"  metrics (JSONL): {result.metrics}")
    console.print(f"  TensorBoard:     tensorboard --logdir {result.tensorboard}")
    console.print(f"  checkpoints:     {result.last_checkpoint}")
    console.print(f"  loss plot:       {result.plot}")
    console.print(f"  sample:          gptforge sample --checkpoint {result.run_dir} --prompt 'The'")
    return 0


def _validation_text(result) -> str:
    """", validation loss A -> B" with what the run knows (a resumed run may lack the first)."""
    losses = [f"{loss:.4f}" for loss in (result.first_val_loss, result.final_val_loss) if loss is not None]
    return f", validation loss {' -> '.join(losses)}" if losses else ""
