"""Every random number generator a step touches, captured and restored (python, numpy, torch CPU/CUDA)."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def capture() -> dict:
    """Plain values and tensors only, so that the file loads with ``torch.load(weights_only=True)``."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    numpy_state = (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached)
    state = {"python": random.getstate(), "numpy": numpy_state, "torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch_cpu"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])
