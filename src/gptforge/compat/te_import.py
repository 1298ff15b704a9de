"""Why transformer_engine.pytorch does not import, from its import error: a finding with the fix for that cause.

TE's loader prefers a system cuDNN (CUDNN_HOME, CUDNN_PATH, CUDA_HOME, /usr/local/cuda, then the loader's path) to the
pip one torch loads; beside torch's, a sub-library of the system one fails with an undefined symbol, or torch's own
check reports a "cuDNN version incompatibility" after the import.
"""

from __future__ import annotations

from gptforge.compat.findings import Finding, Severity

CUDNN_CLASH = ("libcudnn", "cuDNN version incompatibility")


def te_import_failure(version: str | None, error: str | None, pip_cudnn_lib: str | None,
                      torch_cudnn: str | None) -> Finding:
    """The finding for a TransformerEngine VERSION whose import failed with ERROR; PIP_CUDNN_LIB: torch's own
    cuDNN folder (site-packages/nvidia/cudnn/lib) or None; TORCH_CUDNN: the cuDNN version torch reports."""
    version = version or "(version unknown)"
    if pip_cudnn_lib and any(mark in (error or "") for mark in CUDNN_CLASH):
        return Finding("te-system-cudnn", Severity.ERROR,
                       f"TransformerEngine {version} does not import: its loader prefers a system cuDNN, which clashes with "
                       f"torch's own (cuDNN {torch_cudnn or '?'} in {pip_cudnn_lib}): {error}",
                       f"export LD_LIBRARY_PATH={pip_cudnn_lib}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} (torch's cuDNN "
                       "first, for TE and every cuDNN sub-library), or remove the system cuDNN")
    return Finding("te-import-failed", Severity.ERROR,
                   f"TransformerEngine {version} is installed but transformer_engine.pytorch does not import: {error}",
                   "reinstall with pip install --no-build-isolation 'transformer_engine[pytorch]==<same version>' "
                   "against the torch installed now")
