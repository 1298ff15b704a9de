"""pixi task `train-gpt2`: pretrain GPT-2 124M on one GPU, or the tiny config on a CPU.

    pixi run train-gpt2                          # the embedded corpus, sized to learn in minutes
    pixi run train-gpt2 data-path=data/owt_text_document tokenizer-type=gpt2   # your data
    pixi run train-gpt2 train-iters=100          # any gptforge train key=value, or --run-dir DIR

On the embedded corpus the run is shortened (smaller batch, fewer steps) so that a single GPU shows
the loss falling within a couple of minutes; with data-path= the gpt2-124m config runs as published.
`--config NAME` first trains another packaged GPT-2 config on the GPU: the hopper environment's task
(`pixi run -e hopper train-gpt2`) passes gpt2-124m-hopper, gpt2-124m with its kernels (accel = "hopper").
"""

from __future__ import annotations

import sys

from gptforge.cli import main as gptforge

# 64K tokens per step, 250 steps: about a minute on one H100 (validation loss 9.12 -> 5.47 there).
# The embedded corpus is small for 124M parameters: past ~250 steps the validation loss rises again.
EMBEDDED_CORPUS_RUN = ["global-batch-size=64", "micro-batch-size=16", "train-iters=250",
                       "eval-interval=50", "save-interval=250"]


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def arguments(extra: list[str], gpu: bool) -> list[str]:
    config = "gpt2-124m"
    if extra[:1] == ["--config"] and len(extra) > 1:
        config, extra = extra[1], extra[2:]
    if not gpu:
        print(f"train-gpt2: no usable GPU here: training the tiny config (gpt2-tiny) on the CPU instead of "
              f"{config}", flush=True)
        return ["train", "--config", "gpt2-tiny", *extra]
    own_data = any(arg.startswith("data-path=") for arg in extra)
    sizing = [] if own_data else EMBEDDED_CORPUS_RUN
    return ["train", "--config", config, *sizing, *extra]


if __name__ == "__main__":
    sys.exit(gptforge(arguments(sys.argv[1:], has_gpu())))
