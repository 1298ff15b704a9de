"""The values every package reads the same way: versions and compute capabilities, the CUDA toolkit's
layout, GPU names, the training data's split and tokenizer kinds. Imports nothing of gptforge but
``gptforge.errors`` (docs/architecture.md)."""
