"""Text generation from a checkpoint written by the trainer."""

from __future__ import annotations

from pathlib import Path

import torch

from gptforge.errors import GptforgeError, UsageError
from gptforge.model.config import ModelConfig
from gptforge.model.gpt import GPT
from gptforge.train import checkpoint
from gptforge.train.sample_options import check_sampling
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
        saved = checkpoint.load_verified(ckpt, "model.pt")
        # TransformerEngine's FP8 scaling state (accel=te-fp8) is no weight: the plain model samples without it
        model.load_state_dict({name: t for name, t in saved.items() if not name.endswith("._extra_state")})
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
    check_sampling(max_new_tokens, temperature, top_k, seed, prompt)
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
