"""The doctor's report for people: a table of what the machine holds, then the findings with fixes."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gptforge.compat.findings import Severity, findings_table
from gptforge.probe.machine import (Apex, Compiler, CudaHome, Driver, HopperKernels, Host, Machine, NvccBinary, Torch,
                                    TransformerEngine)
from gptforge.terminal import stdout_console

_ABSENT = "-"


def _or_absent(value) -> str:
    return _ABSENT if value in (None, "", [], {}) else str(value)


def _driver_rows(driver: Driver) -> list[tuple[str, str]]:
    if driver.status != "ok":
        return [("NVIDIA driver", driver.error or "no NVIDIA driver found")]
    rows = [("NVIDIA driver", f"{driver.driver_version} (supports CUDA up to {driver.cuda_version})")]
    if not driver.gpus:
        rows.append(("GPU", "none visible"))
    for gpu in driver.gpus:
        rows.append((f"GPU {gpu.index}", f"{gpu.name}, compute capability {gpu.compute_capability}, "
                     f"{gpu.memory_total_mib} MiB ({gpu.memory_free_mib} MiB free)"))
    return rows


def _nvcc_text(entry: NvccBinary | None) -> str:
    if entry is None:
        return "not found"
    if entry.error:
        return entry.error
    root = f", toolkit {entry.toolkit_root}" if entry.toolkit_root else ""
    return f"{entry.version} at {entry.path}{root}"


def _cuda_home_text(home: CudaHome) -> str:
    if home.path is None:
        return "none (CUDA_HOME, CUDA_PATH unset and no nvcc on PATH)"
    if not home.exists:
        return f"{home.path} (from {home.source}): not an existing directory"
    if not home.readable:
        return f"{home.path} (from {home.source}): not readable by this user"
    header = home.cuda_runtime_h or "missing"
    return f"{home.path} (from {home.source}); lib64: {home.lib64 or 'missing'}; cuda_runtime.h: {header}"


def _compiler_text(entry: Compiler) -> str:
    if entry.path is None:
        return f"'{entry.command}' not found ({entry.source})"
    return f"{entry.kind} {entry.version} at {entry.path} ({entry.source})"


def _torch_text(torch: Torch) -> str:
    if not torch.installed:
        return "not installed"
    if torch.error:
        return torch.error
    if not torch.cuda:
        return f"{torch.version} (CPU only)"
    built = f" (built with {torch.cudnn_compiled})" if torch.cudnn_compiled and torch.cudnn_compiled != torch.cudnn else ""
    return (f"{torch.version}, CUDA {torch.cuda}, cuDNN {_or_absent(torch.cudnn)}{built}, "
            f"NCCL {_or_absent(torch.nccl)}, CUDA available: {torch.cuda_available} "
            f"({torch.device_count} devices); archs {' '.join(torch.arch_list) or _ABSENT}")


def _apex_text(apex: Apex) -> str:
    if not apex.installed:
        return "not installed"
    exts = ", ".join(f"{name} {'ok' if e.ok else 'missing'}" for name, e in apex.extensions.items())
    return f"{_or_absent(apex.version)}; {exts}"


def _te_text(te: TransformerEngine) -> str:
    if not te.installed:
        return "not installed"
    state = "imports" if te.import_ok else f"does not import ({te.import_error})"
    packages = ", ".join(f"{name} {version}" for name, version in te.packages.items())
    return f"{_or_absent(te.version)}{f' ({packages})' if packages else ''}; {state}"


def _hopper_text(kernels: HopperKernels) -> str:
    if not kernels.installed:
        return "not installed"
    packages = ", ".join(f"{name} {version}" for name, version in kernels.packages.items())
    return f"{packages}; CuTe DSL at {_or_absent(kernels.dsl_directory)}"


def machine_rows(machine: Machine) -> list[tuple[str, str]]:
    home_rt = machine.cuda_home.libcudart
    loaded = machine.libcudart_loaded
    return [
        ("Python", f"{machine.python.version} ({machine.python.executable})"),
        *_driver_rows(machine.driver),
        ("nvcc (CUDA root)", _nvcc_text(machine.nvcc.cuda_home)),
        ("nvcc (PATH)", _nvcc_text(machine.nvcc.path)),
        ("CUDA root", _cuda_home_text(machine.cuda_home)),
        ("toolkit libcudart", f"{home_rt.version} at {home_rt.real_path}" if home_rt else _ABSENT),
        ("nvcc host compiler", _compiler_text(machine.compilers.nvcc_host)),
        ("C++ compiler", _compiler_text(machine.compilers.cxx)),
        ("torch", _torch_text(machine.torch)),
        ("loaded libcudart", "; ".join(f"{lib.version} at {lib.real_path}" for lib in loaded) or "none loaded"),
        ("apex", _apex_text(machine.apex)),
        ("DeepSpeed", _or_absent(machine.deepspeed.version) if machine.deepspeed.installed else "not installed"),
        ("TransformerEngine", _te_text(machine.transformer_engine)),
        ("FA4 / quack kernels", _hopper_text(machine.hopper_kernels)),
        ("TORCH_CUDA_ARCH_LIST", _or_absent(machine.env["TORCH_CUDA_ARCH_LIST"])),
        *_host_rows(machine.host),
    ]


def _host_rows(host: Host | None) -> list[tuple[str, str]]:
    if host is None:
        return []
    libstdcxx = f"GLIBCXX_{host.libstdcxx} at {host.libstdcxx_path}" if host.libstdcxx else _ABSENT
    return [("glibc", _or_absent(host.glibc)), ("libstdc++", libstdcxx)]


def render(report, strict: bool = False, console: Console | None = None) -> None:
    console = console or stdout_console()
    machine = Table(title="machine", show_header=False, title_justify="left")
    machine.add_column(style="bold")
    machine.add_column(overflow="fold")
    for name, value in machine_rows(report.machine):
        machine.add_row(name, Text(value))  # paths and versions as read: '[' is not rich markup here
    console.print(machine)
    console.print(findings_table(report.findings, "findings") if report.findings else "findings: none")
    counts = {s: sum(f.severity == s for f in report.findings) for s in Severity}
    verdict = "ok" if report.ok(strict) else "NOT ok"
    console.print(f"{verdict}{' (strict)' if strict else ''}: {counts[Severity.ERROR]} errors, "
                  f"{counts[Severity.WARNING]} warnings, {counts[Severity.INFO]} info")
