"""The values every package reads the same way: versions and compute capabilities, GPU names, the
training data's split and tokenizer kinds, the CUDA toolkit's target directory. Imports nothing of
gptforge but its base modules (docs/architecture.md)."""

import os

# NVIDIA's installers and conda-forge's packages both put a target's headers and libraries here; a
# toolkit root links them into include/ and lib64/, a conda prefix into lib/ only.
TARGET_DIR = os.path.join("targets", "x86_64-linux")
