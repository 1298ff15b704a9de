"""Text generation from a checkpoint written by the trainer."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from gptforge.errors import GptforgeError, UsageError
from gptforge.model import GPT, ModelConfig
from gptforge.train import checkpoint
from gptforge.train.config import check_seed
from gptforge.train.data import TokenizerSpec
from gptforge.train.distributed import pick_device


def load_model(ckpt: Path, device: torch.device) -> tuple[GPT, dict]:
    state = checkpoint.read_trainer_state(ckpt)
    weights = ckpt / "model.pt"
    if not weights.is_file():
        raise GptforgeError(f"{ckpt} has no model.pt (a ZeRO-3 checkpoint keeps sharded weights only)",
                            "sample from a ZeRO-1/2 or torch checkpoint, or consolidate with DeepSpeed's zero_to_fp32.py")
    model = GPT(ModelConfig(**state["model_config"]))
    try:
        model.load_state_dict(checkpoint.load_verified(ckpt, "model.pt"))
    except RuntimeError as err:  # tensors of another shape than trainer.pt describes
        raise GptforgeError(f"{weights} does not fit the model in {checkpoint.TRAINER_FILE}: {str(err).splitlines()[0]}",
                            "the checkpoint is damaged; use an older one") from None
    return model.to(device).eval(), state


def load_tokenizer(state: dict, run_dir: Path):
    try:
        return TokenizerSpec(**state["tokenizer"]).load(base=run_dir)
    except UsageError as err:
        raise GptforgeError(f"the run's tokenizer does not load: {err.message}",
                            f"restore {run_dir / 'tokenizer'} (the trainer copies it there)") from None


DEFAULT_NEW_TOKENS = 200  # or what the model's context leaves after the prompt, when that is less


def generate(checkpoint_path: Path, prompt: str, *, max_new_tokens: int | None = None, temperature: float = 0.8,
             top_k: int | None = 50, seed: int = 1234, device: str = "auto") -> dict:
    """MAX_NEW_TOKENS None: DEFAULT_NEW_TOKENS, fewer where the model's context ends sooner."""
    if max_new_tokens is not None and max_new_tokens <= 0:
        raise UsageError("--max-new-tokens", f"must be positive, got {max_new_tokens}", "e.g. --max-new-tokens 200")
    if not 0 <= temperature < math.inf:
        raise UsageError("--temperature", f"must be a finite number >= 0, got {temperature}", "0 means greedy, 0.8 is typical")
    if 0 < temperature < torch.finfo(torch.float32).eps:  # logits divided by it overflow to inf, softmax to nan
        raise UsageError("--temperature", f"{temperature} is below float32's resolution",
                         "use --temperature 0 for greedy decoding, or a typical 0.8")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:  # a byte of the command line that is not UTF-8, kept as a lone surrogate
        raise UsageError("--prompt", f"character {err.start} ({prompt[err.start]!r}) is a byte that is not UTF-8",
                         "pass the prompt as UTF-8 text") from None
    check_seed(seed, "--seed")
    if top_k is not None and top_k < 0:
        raise UsageError("--top-k", f"must be >= 0, got {top_k}", "0 turns the filter off, 50 is typical")
    ckpt = checkpoint.resolve(checkpoint_path)
    dev = pick_device(device, 0)
    model, state = load_model(ckpt, dev)
    tokenizer = load_tokenizer(state, run_dir=ckpt.parent.parent)
    ids = tokenizer.encode(prompt) or [tokenizer.eod_id]
    context = model.cfg.max_position_embeddings
    room = context - len(ids)
    if max_new_tokens is None and room > 0:
        max_new_tokens = min(DEFAULT_NEW_TOKENS, room)
    elif max_new_tokens is None:
        raise UsageError("--prompt", f"a prompt of {len(ids)} tokens leaves no room in the model's context of "
                         f"{context} tokens", "shorten the prompt")
    if len(ids) + max_new_tokens > context:
        raise UsageError("--max-new-tokens", f"{max_new_tokens} new tokens after a prompt of {len(ids)} exceed the "
                         f"model's context of {context} tokens",
                         f"use --max-new-tokens {room}" if room > 0 else "shorten the prompt")
    generator = torch.Generator(device=dev).manual_seed(seed)
    idx = torch.tensor([ids], dtype=torch.long, device=dev)
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
    new_ids = out[0, len(ids):].tolist()
    return {"checkpoint": str(ckpt), "step": state["step"], "prompt": prompt,
            "completion": tokenizer.decode(new_ids), "tokens": len(new_ids)}
