"""`gptforge compat check` and `gptforge compat recommend`: argument parsing and output only."""

from __future__ import annotations

import argparse
import json
import sys

from gptforge.cli import group
from gptforge.errors import UsageError
from gptforge.terminal import stdout_console

_CHECK_HELP = """Judge a combination of versions offline (what-if), with the same rules as `gptforge doctor`.
Give any subset; what is not given is not checked. Exit status: 0 no error, 1 an error, 2 bad input."""

_RECOMMEND_HELP = """Which of gptforge's environments (cpu, cuda-12-6, cuda-12-9, cuda-13-0) fits a machine with
this driver and these GPUs, and why each other one does not. Exit status 1 when no CUDA environment fits."""


def _arg_type(parse, *, keep_text: bool = True):
    """An argparse type= that runs ``parse`` and turns its VersionError into a one-line usage error.

    Returns the stripped text (the Combination takes versions as text), or the parsed value.
    """
    from gptforge.compat import VersionError

    def convert(text: str):
        try:
            value = parse(text)
        except VersionError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return text.strip() if keep_text else value

    return convert


_RECIPES = ("delayed-scaling", "current-scaling", "float8-block-scaling", "mxfp8", "nvfp4")


class _Once(argparse.Action):
    """Store a flag's value; the same flag given again with another value is a conflict, not an override."""

    def __call__(self, parser, namespace, values, option_string=None):
        previous = getattr(namespace, self.dest, None)
        if previous is not None and previous != values:
            raise argparse.ArgumentError(self, f"given twice ({previous} and {values}); give it once")
        setattr(namespace, self.dest, values)


def _driver(text: str):
    from gptforge.compat import parse_driver

    parse_driver(text)


def _known_arch_list(text: str):
    from gptforge.compat import VersionError, format_cc, parse_arch_list, validate_cc

    if text.strip() in ("", "native"):
        return  # torch's cpp_extension then builds for the visible GPUs itself
    sass, _ = parse_arch_list(text)
    if not sass:
        raise VersionError(f"{text!r} names no architecture (e.g. '9.0' or '8.0;9.0+PTX')")
    for arch in sass:
        validate_cc(format_cc(arch.cc))


def _nonempty(text: str):
    from gptforge.compat import VersionError

    if not text.strip():
        raise VersionError("an empty value (leave the flag out when the package is not installed)")


def _version_flag(parser: argparse.ArgumentParser, flag: str, parse, metavar: str, help: str, **kwargs) -> None:
    """A flag taking one version, checked by ``parse``; giving it twice with different values is a usage error."""
    parser.add_argument(flag, action=_Once, type=_arg_type(parse), metavar=metavar, help=help, **kwargs)


def _gpu_name(text: str) -> tuple[str, tuple]:
    from gptforge.compat.gpus import gpu_candidates

    return text.strip(), tuple(gpu_candidates(text))


def _add_gpu_flags(parser: argparse.ArgumentParser) -> None:
    from gptforge.compat import validate_cc

    parser.add_argument("--gpu", dest="gpus", action="append", type=_arg_type(_gpu_name, keep_text=False),
                        metavar="NAME", help="a GPU by name, as nvidia-smi prints it ('NVIDIA H100 80GB HBM3', 'A100', "
                        "'RTX 4090') or as typed ('RTX4090', '4090'); repeat for several. A name several products share "
                        "('TITAN X') is judged as each")
    parser.add_argument("--cc", dest="ccs", action="append", type=_arg_type(validate_cc, keep_text=False),
                        metavar="X.Y", help="a GPU by compute capability (9.0, 8.6, sm_120); repeat for several")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def register(subparsers, groups) -> None:
    from gptforge.compat import parse_clang, parse_cuda, parse_cudnn, parse_gcc, parse_nccl, parse_python, parse_torch
    from gptforge.core.versions import parse_release
    from gptforge.compat.host_libs import parse_glibc, parse_glibcxx
    from gptforge.compat.wheels import read_wheel

    commands = group(subparsers, groups, "compat", "check version combinations; pick an environment")

    check = commands.add_parser("check", help="judge a combination of versions (offline)", description=_CHECK_HELP)
    _version_flag(check, "--driver", _driver, "V",
                  "NVIDIA driver: 580.65.06, a branch (560) or the number torch prints (11040)")
    _add_gpu_flags(check)
    _version_flag(check, "--cuda", parse_cuda, "X.Y", "CUDA toolkit (nvcc) that builds extensions, e.g. 12.4")
    _version_flag(check, "--torch", parse_torch, "V[+cuXYZ]", "torch, e.g. 2.11.0+cu130")
    _version_flag(check, "--torch-cuda", parse_cuda, "X.Y",
                  "CUDA torch was built with (torch.version.cuda), when --torch has no +cuXYZ")
    _version_flag(check, "--python", parse_python, "X.Y", "Python, e.g. 3.12")
    _version_flag(check, "--gcc", parse_gcc, "N[.M]", "host gcc, e.g. 13 or 13.2.0")
    _version_flag(check, "--clang", parse_clang, "N[.M]", "host clang, when it is the host compiler")
    _version_flag(check, "--cudnn", parse_cudnn, "V", "cuDNN, e.g. 9.10.2 (or 91002)")
    _version_flag(check, "--nccl", parse_nccl, "V", "NCCL, e.g. 2.29.7")
    _version_flag(check, "--apex", _nonempty, "V", "apex version or commit (apex's nvcc check applies)")
    _version_flag(check, "--deepspeed", lambda v: parse_release(v, "DeepSpeed"), "V",
                  "DeepSpeed version (its nvcc and arch-list checks apply)")
    _version_flag(check, "--transformer-engine", lambda v: parse_release(v, "TransformerEngine"), "V",
                  "TransformerEngine version (its CC/CUDA/cuDNN floor and FP8 apply)")
    _version_flag(check, "--flash-attn", lambda v: parse_release(v, "flash-attn"), "V",
                  "flash-attn version (its nvcc floor and GPU support apply)")
    check.add_argument("--fp8", action="store_true", help="the run trains in FP8 (TransformerEngine fp8_autocast)")
    check.add_argument("--recipe", choices=_RECIPES, help="the TransformerEngine FP8 recipe (implies --fp8)")
    _version_flag(check, "--torch-arch-list", _known_arch_list, "LIST",
                  "arches the torch build has kernels for, e.g. 'sm_80 sm_90' (default: the published build's)")
    _version_flag(check, "--arch-list", _known_arch_list, "LIST",
                  "the TORCH_CUDA_ARCH_LIST extension builds use, e.g. '9.0a'")
    check.add_argument("--wheel", dest="wheels", action="append", type=_arg_type(read_wheel), metavar="WHEEL",
                       help="a prebuilt extension wheel, as a .whl file or its file name "
                            "(flash_attn-2.5.5+cu118torch2.2cxx11abiFALSE-cp38-cp38-linux_x86_64.whl): its torch, "
                            "CUDA major, C++ ABI and Python are checked; repeat for several")
    _version_flag(check, "--glibc", parse_glibc, "X.Y", "the host's glibc, e.g. 2.17 (ldd --version): against the "
                  "manylinux floor of torch's and the extensions' wheels")
    _version_flag(check, "--libstdcxx", parse_glibcxx, "V", "the newest GLIBCXX the loaded libstdc++ provides, e.g. "
                  "3.4.30 or GLIBCXX_3.4.30 (strings libstdc++.so.6 | grep GLIBCXX): against the gcc that builds "
                  "extensions (--gcc)")
    _version_flag(check, "--torch-cudnn", parse_cudnn, "V", "the cuDNN torch was built with, e.g. 8.9.2 (the "
                  "'compiled against' version torch prints); --cudnn is the one found at run time")
    check.set_defaults(func=run_check)

    recommend = commands.add_parser("recommend", help="pick the environment that fits a machine",
                                    description=_RECOMMEND_HELP)
    _version_flag(recommend, "--driver", _driver, "V", "NVIDIA driver, e.g. 535.104.05 (nvidia-smi); "
                  "default: this machine's driver and GPUs, read through NVML")
    _add_gpu_flags(recommend)
    recommend.set_defaults(func=run_recommend)


def _gpus(args) -> tuple[tuple, tuple]:
    """(compute capabilities, GPUs named ambiguously with the ones each may have) from --cc and --gpu."""
    named = args.gpus or []
    ccs = [*(args.ccs or ()), *(ccs[0] for _, ccs in named if len(ccs) == 1)]
    return tuple(ccs), tuple((name, ccs) for name, ccs in named if len(ccs) > 1)


def combination_from_args(args):
    from gptforge.compat import Combination, parse_cuda, parse_torch
    from gptforge.compat.arches import arch_list_items

    if args.torch and args.torch_cuda:
        tagged = parse_torch(args.torch).cuda
        if tagged and tagged.release != parse_cuda(args.torch_cuda).release:
            raise UsageError("--torch-cuda", f"{args.torch_cuda} conflicts with --torch {args.torch} "
                             f"(a CUDA {tagged.release} build)", "drop --torch-cuda or make the two agree")
    if args.torch and parse_torch(args.torch).is_cpu and args.torch_cuda:
        raise UsageError("--torch-cuda", f"conflicts with --torch {args.torch} (a CPU build)", "drop one of them")
    arch_list = arch_list_items(args.torch_arch_list) if args.torch_arch_list else None
    ccs, choices = _gpus(args)
    return Combination(
        driver=args.driver, ccs=ccs or None, gpu_choices=choices or None, cuda=args.cuda, torch=args.torch,
        torch_cuda=args.torch_cuda, torch_arch_list=tuple(arch_list) if arch_list else None, python=args.python,
        gcc=args.gcc, clang=args.clang, cudnn=args.cudnn, nccl=args.nccl, apex=args.apex,
        deepspeed=args.deepspeed, transformer_engine=args.transformer_engine,
        torch_cuda_arch_list_env=args.arch_list, flash_attn=args.flash_attn,
        fp8=args.fp8 or bool(args.recipe), recipe=args.recipe, wheels=tuple(args.wheels) if args.wheels else None,
        glibc=args.glibc, libstdcxx=args.libstdcxx, torch_cudnn=args.torch_cudnn,
    )


def run_check(args) -> int:
    from gptforge.compat import check, is_ok, report_json
    from gptforge.compat.findings import findings_table

    findings = check(combination_from_args(args))
    if args.json:
        print(json.dumps(report_json(findings), indent=2))
        return 0 if is_ok(findings) else 1
    console = stdout_console()
    if not findings:
        console.print("[green]ok[/green]: no problem found in this combination")
        return 0
    console.print(findings_table(findings, "gptforge compat check"))
    errors = sum(1 for f in findings if f.severity.value == "error")
    console.print("[green]ok[/green]" if is_ok(findings) else f"[bold red]{errors} error(s)[/]")
    return 0 if is_ok(findings) else 1


def run_recommend(args) -> int:
    from rich.table import Table
    from rich.text import Text

    from gptforge.compat import recommend

    ccs, choices = _gpus(args)
    if choices:  # an environment is chosen for one machine: its GPUs must be known
        from gptforge.compat import format_cc

        name, candidates = choices[0]
        raise UsageError("--gpu", f"{name!r} names GPUs of several compute capabilities "
                         f"({', '.join(format_cc(cc) for cc in candidates)})", "give its own with --cc X.Y")
    driver = args.driver
    if driver is None:
        from gptforge.probe.nvml import driver_and_ccs

        driver, found = driver_and_ccs()
        ccs = ccs or found
    result = recommend(driver, ccs)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0 if result.ok else 1
    console = stdout_console()
    table = Table(title=f"gptforge environments for driver {driver}", title_justify="left", show_lines=True)
    for column in ("environment", "CUDA", "fits", "why"):
        table.add_column(column, overflow="fold")
    for verdict in result.verdicts:
        env = verdict.environment
        mark = "[green]yes[/]" if verdict.fits else "[red]no[/]"
        table.add_row(env.name, env.cuda or "-", mark, Text("\n".join(verdict.reasons) or "no problem found"))
    console.print(table)
    if result.ok:
        console.print(f"use [bold]{result.chosen.name}[/]: {result.chosen.setup}")
        console.print(f"without pixi: {result.chosen.venv}", markup=False)
        for env in result.faster:
            console.print(f"faster on these GPUs: [bold]{env.name}[/]: {env.setup} ({env.why})")
        return 0
    sys.stderr.write(f"gptforge: {result.reason}\n")
    return 1
