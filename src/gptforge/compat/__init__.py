"""The compatibility engine: version facts as data (compat/data/*.toml), rules as code.

    check(Combination(driver="535.104.05", ccs=((9, 0),), torch="2.11.0+cu130"))
      -> [Finding(code="driver-too-old", severity=error, ...)]

Finding codes are a stable API; docs/compat.md lists them.

Names are resolved lazily (PEP 562): ``import gptforge.compat.findings`` must stay cheap, because every
CLI command imports it and ``fix-links`` runs on each environment activation.
"""

from importlib import import_module

_EXPORTS = {
    "gptforge.compat.archlist": ("arch_list_for", "targetable_arches"),
    "gptforge.compat.arches": ("Arch", "parse_arch", "parse_arch_list"),
    "gptforge.compat.combination": ("Combination",),
    "gptforge.compat.project_envs": (
        "Environment", "Recommendation", "Verdict", "environment", "environments",
    ),
    "gptforge.compat.findings": ("Finding", "Severity", "is_ok", "report_json"),
    "gptforge.compat.gpus": ("UnknownGpu", "gpu_cc", "validate_cc"),
    "gptforge.compat.rules": ("check", "recommend"),
    "gptforge.core.versions": (
        "CudaVersion", "DriverVersion", "TorchVersion", "VersionError", "format_cc", "parse_cc",
        "parse_clang", "parse_cuda", "parse_cudnn", "parse_driver", "parse_gcc", "parse_nccl",
        "parse_python", "parse_torch",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'gptforge.compat' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
