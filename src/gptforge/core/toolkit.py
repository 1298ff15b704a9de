"""Where a CUDA toolkit keeps its files, whoever installed it.

NVIDIA's installers and conda-forge's packages both put the target's headers and libraries under
``targets/x86_64-linux``; a toolkit root links them into ``include`` and ``lib64``, a conda prefix
into ``lib`` only.
"""

import os

TARGET_DIR = os.path.join("targets", "x86_64-linux")
