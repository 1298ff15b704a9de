"""What only a live machine shows: findings the doctor adds to the compatibility rules.

Each check takes the probed Machine and returns findings; codes are stable (see docs/doctor.md).
"""

from __future__ import annotations

import os

from gptforge.compat.findings import Finding, Severity
from gptforge.compat.extension_rules import te_import_failure
from gptforge.core.versions import cuda_release
from gptforge.probe.machine import CudaHome, Machine

E, W, I = Severity.ERROR, Severity.WARNING, Severity.INFO


def _has_gpu(machine: Machine) -> bool:
    return bool(machine.driver.gpus)


def _torch_has_cuda(machine: Machine) -> bool:
    return bool(machine.torch.cuda)


def check_driver(machine: Machine) -> list[Finding]:
    driver = machine.driver
    if driver.status == "error":
        return [Finding("nvml-error", E, f"the NVIDIA driver is installed but NVML does not answer: {driver.error}",
                        "a 'Driver/library version mismatch' means the driver was upgraded without a reboot: "
                        "reboot (or reload the nvidia kernel modules); otherwise reinstall the driver")]
    if driver.status == "no-driver":
        return [Finding("no-gpu", I, "no NVIDIA driver found: GPU, driver and FP8 checks skipped; the rest is checked",
                        "nothing to do on a CPU machine; on a GPU machine install the NVIDIA driver "
                        "(libnvidia-ml.so.1 must be loadable)")]
    if not driver.gpus:
        return [Finding("no-gpu", I, f"NVIDIA driver {driver.driver_version} found but no GPU is visible",
                        "check CUDA_VISIBLE_DEVICES and the container's GPU access (--gpus all)")]
    return []


def check_torch(machine: Machine) -> list[Finding]:
    torch, gpu = machine.torch, _has_gpu(machine)
    if not torch.installed:
        return [Finding("torch-missing", W if gpu else I, "torch is not installed in this Python",
                        "install the project's locked environment: pixi run setup, or without pixi the pip line "
                        "gptforge compat recommend prints for this machine")]
    if torch.error:
        return [Finding("torch-import-failed", E, torch.error,
                        "reinstall torch in this environment; an 'undefined symbol' names the library that "
                        "shadows torch's own (check LD_LIBRARY_PATH)")]
    if not torch.cuda:
        if gpu:  # the compatibility rules report it as torch-cpu-build (warning), with the environment to use
            return []
        return [Finding("torch-cpu-only", I, f"torch {torch.version} is a CPU-only build", "nothing to do without a GPU")]
    if gpu and not torch.cuda_available:
        why = f": {torch.cuda_warning}" if torch.cuda_warning else ""
        return [Finding("torch-cuda-unavailable", E,
                        f"torch {torch.version} (CUDA {torch.cuda}) cannot use the GPU{why}",
                        "see the driver findings; 'gptforge compat recommend --driver V' names an environment "
                        "that fits this driver")]
    return []


_NVCC_FIX = ("install the CUDA toolkit whose major.minor matches torch's CUDA (the locked environment carries it) "
             "and point CUDA_HOME at it")


def check_nvcc(machine: Machine) -> list[Finding]:
    nvcc, findings = machine.nvcc, []
    if nvcc.cuda_home is None and nvcc.path is None:
        severity = W if _torch_has_cuda(machine) else I
        return [Finding("nvcc-missing", severity,
                        "no nvcc under CUDA_HOME/CUDA_PATH or on PATH: CUDA extensions (apex, DeepSpeed ops, "
                        "TransformerEngine) cannot be built", _NVCC_FIX)]
    reported = set()
    for where, entry in (("the CUDA root", nvcc.cuda_home), ("PATH", nvcc.path)):
        if entry and entry.error and os.path.exists(entry.path):
            if os.path.realpath(entry.path) in reported:  # the CUDA root guessed from that same nvcc
                continue
            reported.add(os.path.realpath(entry.path))
            findings.append(Finding("nvcc-broken", E, f"nvcc from {where} ({entry.path}) does not run: {entry.error}",
                                    "reinstall the CUDA toolkit; check that the file is an executable for this machine"))
    if nvcc.agree is False:
        home, path = nvcc.cuda_home, nvcc.path
        findings.append(Finding(
            "nvcc-path-disagree", W,
            f"nvcc under the CUDA root is {home.version} ({home.path}) but 'nvcc' on PATH is "
            f"{path.version} ({path.path}): builds use the first, your shell the second",
            f"put {os.path.dirname(home.path)} first on PATH, or point CUDA_HOME at the toolkit you mean"))
    return findings


def _layout_findings(home: CudaHome) -> list[Finding]:
    path, findings = home.path, []
    if home.lib64 in (None, "broken symlink") and home.lib:
        findings.append(Finding(
            "cuda-home-no-lib64", W,
            f"{path} has lib/ but no lib64 (conda layout): DeepSpeed's async_io/gds ops and older op builders "
            f"link with -L$CUDA_HOME/lib64 and fail with 'cannot find -lcudart'",
            f"gptforge fix-links --prefix {path} (or ln -sfn lib {os.path.join(path, 'lib64')})"))
    if home.cuda_runtime_h is None:
        findings.append(Finding(
            "cuda-home-no-headers", W,
            f"no cuda_runtime.h under {path}/include or {path}/targets/x86_64-linux/include: "
            "C++ sources that include CUDA headers will not compile",
            "install the CUDA headers (cuda-cudart-dev / the toolkit) or point CUDA_HOME at a full toolkit"))
    elif home.headers_only_in_targets:
        findings.append(Finding(
            "cuda-home-no-headers", W,
            f"cuda_runtime.h is only in {path}/targets/x86_64-linux/include (conda layout), not in {path}/include: "
            "tools that add -I$CUDA_HOME/include do not find it",
            f"gptforge fix-links --prefix {path} links them into {path}/include; or export "
            f"CPATH={path}/targets/x86_64-linux/include${{CPATH:+:$CPATH}}"))
    return findings


def check_cuda_home(machine: Machine) -> list[Finding]:
    home, nvcc = machine.cuda_home, machine.nvcc
    if home.path is None:
        return []
    if not home.exists:
        what = "is not a directory" if os.path.exists(home.path) else "does not exist"
        return [Finding("cuda-home-not-found", E, f"{home.source}={home.path} {what}",
                        f"unset {home.source} or point it at a CUDA toolkit (the directory holding bin/nvcc)")]
    if not home.readable:
        return [Finding("cuda-home-unreadable", E,
                        f"{home.source}={home.path} cannot be read by this user: builds find no nvcc, headers or "
                        "libraries in it", f"make it readable (chmod a+rx) or point {home.source} at a readable toolkit")]
    if home.source in ("CUDA_HOME", "CUDA_PATH") and nvcc.cuda_home and nvcc.cuda_home.error \
            and not os.path.exists(nvcc.cuda_home.path):
        findings = [Finding("cuda-home-no-nvcc", E, f"{home.source}={home.path} has no bin/nvcc",
                            f"point {home.source} at a CUDA toolkit, or install nvcc into it")]
        return findings + _layout_findings(home)
    root = nvcc.path.toolkit_root if nvcc.path else None
    if home.source == "nvcc on PATH" and root and os.path.realpath(home.path) != root:
        return [Finding(
            "cuda-home-guess-wrong", W,
            f"CUDA_HOME is unset, so torch and DeepSpeed guess {home.path} from {nvcc.path.path}, "
            f"but that nvcc runs from {root}: headers and libraries are looked for in the wrong place",
            f"export CUDA_HOME={root}")]
    return _layout_findings(home)


def check_libcudart(machine: Machine) -> list[Finding]:
    loaded, torch_cuda = machine.libcudart_loaded, machine.torch.cuda
    findings = []
    majors = {v.major for lib in loaded if (v := cuda_release(lib.version))}
    if len({lib.real_path for lib in loaded}) > 1:
        files = ", ".join(f"{lib.real_path} ({lib.version})" for lib in loaded)
        findings.append(Finding(
            "libcudart-multiple", E if len(majors) > 1 else W,
            f"more than one CUDA runtime is loaded in this process: {files}",
            "remove the package that brings the stray runtime (e.g. a transformer_engine_cu12 next to a cu13 "
            "torch) or take its directory off LD_LIBRARY_PATH"))
    want = cuda_release(torch_cuda)
    for lib in loaded:
        got = cuda_release(lib.version)
        if want is None or got is None or got == want:
            continue
        older = got.major != want.major or got < want
        findings.append(Finding(
            "libcudart-version-mismatch", E if older else W,
            f"torch was built with CUDA {torch_cuda} but the loaded libcudart is {lib.version} "
            f"({lib.real_path})" + (": symbols torch needs may be missing" if older else ""),
            "make libcudart.so.* resolve to the runtime of torch's CUDA: remove the stray copy or fix the "
            "link (gptforge fix-links), and check LD_LIBRARY_PATH"))
    return findings


def check_compilers(machine: Machine) -> list[Finding]:
    host, findings = machine.compilers.nvcc_host, []
    broken = {}
    for entry in vars(machine.compilers).values():
        if entry.error:
            broken.setdefault((entry.command, entry.source), entry.error)
    for (command, source), error in broken.items():
        findings.append(Finding("compiler-broken", W, f"compiler '{command}' (from {source}) cannot be used: {error}",
                                f"fix or unset {source}" if source in ("CC", "CXX", "CUDAHOSTCXX", "NVCC_CCBIN") else "reinstall it or take it off PATH"))
    if machine.nvcc.version and host.path is None and not host.error:
        findings.append(Finding("host-compiler-not-found", W,
                                f"the host compiler nvcc would run ('{host.command}', from {host.source}) is not found",
                                "install gcc/g++ (e.g. apt-get install build-essential) or set CC/CUDAHOSTCXX to one"))
    return findings


def check_apex(machine: Machine) -> list[Finding]:
    apex = machine.apex
    if not apex.installed:
        return []
    missing = [n for n, e in apex.extensions.items() if not e.ok and e.error.startswith("ModuleNotFoundError")]
    broken = {n: e.error for n, e in apex.extensions.items() if not e.ok and n not in missing}
    findings = []
    if missing:
        findings.append(Finding(
            "apex-python-only", E,
            f"apex is installed without its CUDA extensions (No module named '{missing[0]}'"
            + (f"; also {', '.join(missing[1:])}" if missing[1:] else "") + ")",
            "rebuild apex with its extensions: gptforge build apex (or APEX_CPP_EXT=1 APEX_CUDA_EXT=1 "
            "pip install -v --no-build-isolation <apex source>)"))
    for name, error in broken.items():
        findings.append(Finding(
            "apex-extension-broken", E, f"apex extension {name} is installed but does not load: {error}",
            "rebuild apex against the torch installed now (an undefined symbol means it was built for another torch)"))
    return findings


def check_deepspeed(machine: Machine) -> list[Finding]:
    if machine.deepspeed.installed and not machine.nvcc.version:
        return [Finding("deepspeed-no-nvcc", W,
                        f"DeepSpeed {machine.deepspeed.version or '(version unknown)'} is installed but there is no nvcc: its ops "
                        "(FusedAdam, cpu_adam) compile at first use and will fail",
                        "install the CUDA toolkit matching torch's CUDA and set CUDA_HOME, or prebuild the ops "
                        "(DS_BUILD_OPS=1)")]
    return []


def check_transformer_engine(machine: Machine) -> list[Finding]:
    te = machine.transformer_engine
    if te.installed and te.import_ok is False:
        return [te_import_failure(te.version, te.import_error, te.pip_cudnn_lib, machine.torch.cudnn)]
    return []


def check_hopper_kernels(machine: Machine) -> list[Finding]:
    kernels = machine.hopper_kernels
    if "quack-kernels" in kernels.packages and kernels.dsl_outside_site_packages:
        return [Finding("cute-dsl-outside-site-packages", W,
                        f"the CuTe DSL (nvidia-cutlass-dsl) is installed outside a site-packages directory "
                        f"({kernels.dsl_directory}): quack's kernel cache fails on it, so accel=hopper "
                        "stops with that reason",
                        "install nvidia-cutlass-dsl and quack-kernels into the environment with pip (not pip install --target)")]
    return []


CHECKS = (check_driver, check_torch, check_nvcc, check_cuda_home, check_libcudart, check_compilers,
          check_apex, check_deepspeed, check_transformer_engine, check_hopper_kernels)


def live_findings(machine: Machine) -> list[Finding]:
    return [finding for check in CHECKS for finding in check(machine)]
