"""Where things live in a conda/pixi prefix that holds CUDA 12+ packages from conda-forge.

conda-forge installs CUDA files under ``targets/x86_64-linux`` and links the shared libraries into
``lib``; there is no ``lib64`` and the CUDA headers are not in ``include``. gptforge makes the prefix
itself usable as ``CUDA_HOME`` (what ``torch.utils.cpp_extension`` finds from ``$PREFIX/bin/nvcc``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gptforge.core import TARGET_DIR

# Temporary names of links being created: "<dir>/.gptforge-tmp.<pid>.<name>". A run killed between
# creating one and renaming it leaves it behind; the next run (or --undo) removes it.
TMP_MARK = ".gptforge-tmp."
STATE_DIR = ".gptforge"
UNDO_FILE = "links-undo.json"


@dataclass(frozen=True)
class Layout:
    prefix: str  # absolute, symlinks resolved

    @classmethod
    def of(cls, prefix: str) -> "Layout":
        return cls(os.path.realpath(prefix))

    @property
    def lib(self) -> str:
        return os.path.join(self.prefix, "lib")

    @property
    def lib64(self) -> str:
        return os.path.join(self.prefix, "lib64")

    @property
    def include(self) -> str:
        return os.path.join(self.prefix, "include")

    @property
    def target_lib(self) -> str:
        return os.path.join(self.prefix, TARGET_DIR, "lib")

    @property
    def target_include(self) -> str:
        return os.path.join(self.prefix, TARGET_DIR, "include")

    @property
    def undo_path(self) -> str:
        return os.path.join(self.prefix, STATE_DIR, UNDO_FILE)

    def library_dirs(self) -> list[str]:
        """Directories whose library links are checked: lib first, then the target lib."""
        return [d for d in (self.lib, self.target_lib) if os.path.isdir(d)]

    def inside(self, path: str) -> bool:
        """Whether ``path`` (resolved) lies inside the prefix."""
        real = os.path.realpath(path)
        return real == self.prefix or real.startswith(self.prefix + os.sep)

    def rel(self, path: str) -> str:
        return os.path.relpath(path, self.prefix)
