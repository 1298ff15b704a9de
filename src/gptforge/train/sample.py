"""Text generation from a checkpoint written by the trainer."""

from __future__ import annotations

from pathlib import Path

import torch

from gptforge.errors import GptforgeError, UsageError
from gptforge.model import GPT, ModelConfig
from gptforge.train import checkpoint
from gptforge.train.data import TokenizerSpec


def load_model(ckpt: Path, device: torch.device) -> tuple[GPT, dict]:
    state = checkpoint.read_trainer_state(ckpt)
    weights = ckpt / "model.pt"
    if not weights.is_file():
        raise GptforgeError(f"{ckpt} has no model.pt (a ZeRO-3 checkpoint keeps sharded weights only)",
                            "sample from a ZeRO-1/2 or torch checkpoint, or consolidate with DeepSpeed's zero_to_fp32.py")
    model = GPT(ModelConfig(**state["model_config"]))
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return model.to(device).eval(), state


def generate(checkpoint_path: Path, prompt: str, *, max_new_tokens: int = 200, temperature: float = 0.8,
             top_k: int | None = 50, seed: int = 1234, device: str = "auto") -> dict:
    if max_new_tokens <= 0:
        raise UsageError("--max-new-tokens", f"must be positive, got {max_new_tokens}", "e.g. --max-new-tokens 200")
    if temperature < 0:
        raise UsageError("--temperature", f"must be >= 0, got {temperature}", "0 means greedy, 0.8 is typical")
    ckpt = checkpoint.resolve(checkpoint_path)
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device))
    model, state = load_model(ckpt, dev)
    run_dir = ckpt.parent.parent
    tokenizer = TokenizerSpec(**state["tokenizer"]).load(base=run_dir)
    ids = tokenizer.encode(prompt) or [tokenizer.eod_id]
    generator = torch.Generator(device=dev).manual_seed(seed)
    idx = torch.tensor([ids], dtype=torch.long, device=dev)
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
    new_ids = out[0, len(ids):].tolist()
    return {"checkpoint": str(ckpt), "step": state["step"], "prompt": prompt,
            "completion": tokenizer.decode(new_ids), "tokens": len(new_ids)}
