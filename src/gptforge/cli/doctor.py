"""CLI for `gptforge doctor`: argument parsing only; the work is gptforge.doctor.run_doctor."""

from __future__ import annotations

import json
import sys

DESCRIPTION = (
    "Probe this machine (NVIDIA driver and GPUs through NVML, nvcc under CUDA_HOME and on PATH, host "
    "compilers, torch with its CUDA, cuDNN and NCCL, the libcudart actually loaded, the CUDA_HOME layout, "
    "apex, DeepSpeed, TransformerEngine), judge it with the compatibility rules and print every problem with "
    "its fix. Without a GPU or driver it says so and checks the rest. Exit status: 0 when nothing present is "
    "broken (no error finding), 1 when something is (--strict: also on any warning)."
)


def run(args) -> int:
    from gptforge.doctor import run_doctor

    report = run_doctor()
    if args.json:
        json.dump(report.to_json(args.strict), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from gptforge.doctor.render import render

        render(report, strict=args.strict)
    return report.exit_code(args.strict)


def register(subparsers, groups) -> None:
    parser = subparsers.add_parser("doctor", help="check this machine's GPU environment and say how to fix it",
                                   description=DESCRIPTION)
    parser.add_argument("--json", action="store_true",
                        help="print {ok, findings, machine} as JSON (schema: gptforge/schemas/doctor.schema.json)")
    parser.add_argument("--strict", action="store_true", help="fail (exit 1) on warnings too, not only on errors")
    parser.set_defaults(func=run)
