"""After install: the compiled modules import and agree numerically with torch on random inputs.

Run in a fresh interpreter (``python -m gptforge.build.verify apex|deepspeed``) so it sees the wheel just
installed, not modules an earlier import left behind. Prints JSON; exit 0 when every check passes.

Tolerances (float32 unless stated; |a-b| <= atol + rtol*|b|, torch.testing.assert_close semantics):
- FusedLayerNorm vs torch.nn.functional.layer_norm, fp32 (8x512x1024): output and input grad
  atol 1e-4 rtol 1e-4; weight/bias grads (sums over 4096 rows) atol 1e-3 rtol 1e-4.
- FusedLayerNorm in bf16 (Megatron's case) vs torch's bf16 layer_norm: atol 2e-2 rtol 1.6e-2 (bf16 eps 2^-7).
- FusedAdam (AdamW mode) vs torch.optim.AdamW, 20 steps, lr 1e-3, wd 0.01, 5 tensors: atol 1e-5 rtol 1e-5
  (a wrong bias correction or decay is off by ~1e-3 after one step).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile

LN_SHAPE = (8, 512, 1024)
ADAM_SHAPES = [(1024, 1024), (4096,), (512, 3, 7), (1,), (50304, 64)]
ADAM_STEPS = 20


def _diff(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


def _close(name: str, a, b, atol: float, rtol: float) -> dict:
    import torch

    ok = bool(torch.allclose(a.float(), b.float(), atol=atol, rtol=rtol))
    return {"check": name, "ok": ok, "max_abs_diff": _diff(a, b), "atol": atol, "rtol": rtol}


def check_imports(modules: list[str]) -> list[dict]:
    import torch  # noqa: F401 - loads libc10/libtorch, which the extensions link against without an rpath

    out = []
    for name in modules:
        try:
            mod = importlib.import_module(name)
            out.append({"check": f"import {name}", "ok": True, "file": getattr(mod, "__file__", None)})
        except Exception as err:  # report any failure to load
            out.append({"check": f"import {name}", "ok": False, "error": f"{type(err).__name__}: {err}"})
    return out


def check_layer_norm() -> list[dict]:
    import torch
    from apex.normalization import FusedLayerNorm

    torch.manual_seed(0)
    hidden = LN_SHAPE[-1]
    x = torch.randn(*LN_SHAPE, device="cuda", requires_grad=True)
    ln = FusedLayerNorm(hidden).cuda()
    with torch.no_grad():
        ln.weight.copy_(torch.randn(hidden) * 0.5 + 1)
        ln.bias.copy_(torch.randn(hidden) * 0.1)
    w = ln.weight.detach().clone().requires_grad_(True)
    b = ln.bias.detach().clone().requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    y = ln(x)
    y_ref = torch.nn.functional.layer_norm(x_ref, (hidden,), w, b, ln.eps)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    out = [_close("FusedLayerNorm fp32 forward", y, y_ref, 1e-4, 1e-4),
           _close("FusedLayerNorm fp32 grad input", x.grad, x_ref.grad, 1e-4, 1e-4),
           _close("FusedLayerNorm fp32 grad weight", ln.weight.grad, w.grad, 1e-3, 1e-4),
           _close("FusedLayerNorm fp32 grad bias", ln.bias.grad, b.grad, 1e-3, 1e-4)]
    xb = x.detach().bfloat16()
    lnb = FusedLayerNorm(hidden).cuda().bfloat16()
    with torch.no_grad():
        lnb.weight.copy_(ln.weight)
        lnb.bias.copy_(ln.bias)
        yb = lnb(xb)
        yb_ref = torch.nn.functional.layer_norm(xb, (hidden,), lnb.weight, lnb.bias, ln.eps)
    out.append(_close("FusedLayerNorm bf16 forward", yb, yb_ref, 2e-2, 1.6e-2))
    return out


def _adam_pair(opt_factory, device: str) -> dict:
    """Run ``opt_factory`` and torch.optim.AdamW on the same params and grads; compare the params."""
    import torch

    torch.manual_seed(1)
    params = [torch.randn(*s, device=device) for s in ADAM_SHAPES]
    ours = [p.clone().requires_grad_(True) for p in params]
    ref = [p.clone().requires_grad_(True) for p in params]
    opt = opt_factory(ours)
    opt_ref = torch.optim.AdamW(ref, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    for _ in range(ADAM_STEPS):
        grads = [torch.randn_like(p) for p in params]
        for p, q, g in zip(ours, ref, grads):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        opt_ref.step()
    a = torch.cat([p.detach().flatten() for p in ours])
    b = torch.cat([p.detach().flatten() for p in ref])
    moved = float((b - torch.cat([p.flatten() for p in params])).abs().max())
    return {**_close("", a, b, 1e-5, 1e-5), "max_param_change": moved}


def check_apex_adam() -> dict:
    from apex.optimizers import FusedAdam

    res = _adam_pair(lambda ps: FusedAdam(ps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                          adam_w_mode=True), "cuda")
    return {**res, "check": f"apex FusedAdam vs torch AdamW, {ADAM_STEPS} steps"}


def verify_apex(modules: list[str]) -> list[dict]:
    results = check_imports(modules)
    if all(r["ok"] for r in results):
        if "fused_layer_norm_cuda" in modules:
            results += check_layer_norm()
        if "amp_C" in modules:
            results.append(check_apex_adam())
    return results


def verify_deepspeed(ops: list[str]) -> list[dict]:
    """Each op is prebuilt (in the wheel, no JIT) and FusedAdam / DeepSpeedCPUAdam agree with torch."""
    with tempfile.TemporaryDirectory() as jit_dir:
        os.environ["TORCH_EXTENSIONS_DIR"] = jit_dir  # any JIT build would land here
        results = []
        from deepspeed.git_version_info import installed_ops

        for op in ops:
            results.append({"check": f"{op} prebuilt", "ok": bool(installed_ops.get(op))})
        if "fused_adam" in ops and installed_ops.get("fused_adam"):
            from deepspeed.ops.adam import FusedAdam

            res = _adam_pair(lambda ps: FusedAdam(ps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                                  adam_w_mode=True), "cuda")
            results.append({**res, "check": f"DeepSpeed FusedAdam vs torch AdamW, {ADAM_STEPS} steps"})
        if "cpu_adam" in ops and installed_ops.get("cpu_adam"):
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            res = _adam_pair(lambda ps: DeepSpeedCPUAdam(ps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                                         weight_decay=0.01, adamw_mode=True), "cpu")
            results.append({**res, "check": f"DeepSpeed CPUAdam vs torch AdamW, {ADAM_STEPS} steps"})
        jit = sorted(os.listdir(jit_dir))
        results.append({"check": "no JIT compile at use", "ok": not jit, "jit_built": jit})
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gptforge.build.verify")
    parser.add_argument("package", choices=["apex", "deepspeed"])
    parser.add_argument("--modules", default="apex_C,amp_C,fused_layer_norm_cuda")
    parser.add_argument("--ops", default="fused_adam")
    args = parser.parse_args(argv)
    try:
        if args.package == "apex":
            results = verify_apex(args.modules.split(","))
        else:
            results = verify_deepspeed(args.ops.split(","))
    except Exception as err:  # a crash in a check is a failed check, reported as JSON
        results = [{"check": "verification", "ok": False, "error": f"{type(err).__name__}: {err}"}]
    ok = all(r["ok"] for r in results)
    print(json.dumps({"ok": ok, "results": results}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
