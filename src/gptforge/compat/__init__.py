"""The compatibility engine: version facts as data (compat/data/*.toml), rules as code.

    check(Combination(driver="535.104.05", ccs=((9, 0),), torch="2.11.0+cu130"))
      -> [Finding(code="driver-too-old", severity=error, ...)]

Finding codes are a stable API; docs/compat.md lists them.
"""

from gptforge.compat.archlist import arch_list_for, targetable_arches
from gptforge.compat.arches import Arch, parse_arch, parse_arch_list
from gptforge.compat.combination import Combination
from gptforge.compat.environments import Environment, Recommendation, Verdict, environment, environments, recommend
from gptforge.compat.findings import Finding, Severity, is_ok, report_json
from gptforge.compat.gpus import UnknownGpu, gpu_cc, validate_cc
from gptforge.compat.rules import check
from gptforge.compat.versions import (
    CudaVersion,
    DriverVersion,
    TorchVersion,
    VersionError,
    format_cc,
    parse_cc,
    parse_clang,
    parse_cuda,
    parse_cudnn,
    parse_driver,
    parse_gcc,
    parse_nccl,
    parse_python,
    parse_torch,
)

__all__ = [
    "Arch", "Combination", "CudaVersion", "DriverVersion", "Environment", "Finding", "Recommendation",
    "Severity", "TorchVersion", "UnknownGpu", "Verdict", "VersionError", "arch_list_for", "check",
    "environment", "environments", "format_cc", "gpu_cc", "is_ok", "parse_arch", "parse_arch_list",
    "parse_cc", "parse_clang", "parse_cuda", "parse_cudnn", "parse_driver", "parse_gcc", "parse_nccl",
    "parse_python", "parse_torch", "recommend", "report_json", "targetable_arches", "validate_cc",
]
