"""The output layer + cross-entropy in bf16, in FP8 (fp8-output=true) and through quack's epilogue
(loss-epilogue=true): the whole and each piece.

    PYTHONPATH=src GPTFORGE_BENCH_OUT=out python3 bench/fp8_head.py                 # 124M and 350M widths
    PYTHONPATH=src python3 bench/fp8_head.py --tokens 32768 --hidden 768 --vocab 50257 --padded-vocab 50304

For TOKENS x HIDDEN hidden states and a (VOCAB x HIDDEN) output matrix it times, with CUDA events after
untimed warm-up: the fused loss's forward + gradients in bf16, in FP8 and, on an sm_90 GPU with
quack-kernels, with the softmax in the logits GEMM's epilogue (each eager and compiled), then
the pieces of each: the three GEMMs in bf16 and as FP8 scaled matmuls, the casts to E4M3, the layout
copies cuBLAS's FP8 matmul needs, and the cross-entropy kernel writing its gradient in bf16 and in E5M2.
Needs an sm_89+ GPU. A table is printed; JSON goes to $GPTFORGE_BENCH_OUT/fp8_head.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from fp8_linear import cuda_ms  # bench/ is this script's directory
from gptforge.model import kernels
from gptforge.model.loss import GRAD_SCALE, linear_cross_entropy
from gptforge.model.scaled_mm import E5M2, column_major, fp8_matmul_gpu, scaled_mm, to_e4m3
from gptforge.model.xent import xent


VARIANTS = {"bf16": {}, "FP8": {"fp8": True}, "epilogue (quack)": {"epilogue": True}}


def whole(h, w, t, vocab: int, variant: str, compiled: bool):
    def loss_and_grads():
        loss = linear_cross_entropy(h, w, t, vocab, h.shape[0], **VARIANTS[variant])
        loss.backward()
        return loss

    run = torch.compile(loss_and_grads) if compiled else loss_and_grads
    return run


def pieces(h, w, t, vocab: int) -> dict:
    """name -> step of each piece, on tensors made once."""
    bf = torch.bfloat16
    hb, wb = h.detach().to(bf), w.detach().to(bf)
    logits = hb @ wb.t()
    _, g = xent(logits, t, vocab, 1.0 / h.shape[0])
    h8, sh = to_e4m3(hb)
    w8, sw = to_e4m3(wb)
    _, g8 = xent(logits, t, vocab, GRAD_SCALE, E5M2, target_column=False)
    grad_w = torch.zeros(w.shape, device=w.device)
    sg = sh.new_tensor(1.0 / (h.shape[0] * GRAD_SCALE))
    w8_cols, g8_t, h8_cols = column_major(w8), g8.t().contiguous(), column_major(h8)
    transpose = torch.compile(lambda g: g.t().contiguous())
    return {
        "GEMM logits, bf16": lambda: hb @ wb.t(),
        "GEMM logits, FP8": lambda: scaled_mm(h8, w8.t(), sh, sw, bf),
        "GEMM grad h, bf16": lambda: g @ wb,
        "GEMM grad h, FP8": lambda: scaled_mm(g8, w8_cols, sg, sw, bf),
        "GEMM grad W, bf16": lambda: g.t() @ hb,
        "GEMM grad W, FP8 (fp32 out)": lambda: scaled_mm(g8_t, h8_cols, sg, sh, torch.float32),
        "xent, bf16 gradient": lambda: xent(logits, t, vocab, 1.0 / h.shape[0]),
        "xent, E5M2 gradient (target column 0)": lambda: xent(logits, t, vocab, GRAD_SCALE, E5M2, target_column=False),
        "the target's entry, exact (W rows gathered, h rows added into grad W)":
            lambda: (w.detach()[t].float() * sg, grad_w.index_add_(0, t, h.detach().float() * sg)),
        "E5M2 gradient transposed, eager": lambda: g8.t().contiguous(),
        "E5M2 gradient transposed, compiled": lambda: transpose(g8),
        "casts of h and W to E4M3": lambda: (to_e4m3(hb), to_e4m3(wb)),
    }


def epilogue_here() -> bool:
    return kernels.quack_unusable(torch.device("cuda"), kernels.QUACK_LCE_MODULE, sm90_only=True) is None


def measure(tokens: int, hidden: int, vocab: int, vocab_padded: int, warmup: int, iters: int) -> list[dict]:
    torch.manual_seed(0)
    h = (torch.randn(tokens, hidden, device="cuda") * 2).requires_grad_()
    w = (torch.randn(vocab_padded, hidden, device="cuda") * 0.02).requires_grad_()
    t = torch.randint(0, vocab, (tokens,), device="cuda")
    rows = []
    with torch.autocast("cuda", dtype=torch.bfloat16):
        for variant in VARIANTS if epilogue_here() else ("bf16", "FP8"):
            for compiled in (False, True):
                name = f"whole: {variant}, {'compiled' if compiled else 'eager'}"
                rows.append({"shape": f"{tokens}x{hidden}x{vocab_padded}", "what": name,
                             "ms": cuda_ms(whole(h, w, t, vocab, variant, compiled), warmup, iters)})
    for name, step in pieces(h, w, t, vocab).items():
        rows.append({"shape": f"{tokens}x{hidden}x{vocab_padded}", "what": name, "ms": cuda_ms(step, warmup, iters)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/fp8_head.py", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--hidden", default="768,1024", help="comma list of widths")
    p.add_argument("--vocab", type=int, default=50257, help="real vocabulary (targets are drawn below it)")
    p.add_argument("--padded-vocab", type=int, default=50304, help="rows of the output matrix")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or not fp8_matmul_gpu(torch.device("cuda")):
        print("fp8_head: needs an sm_89+ GPU (FP8 tensor cores)", file=sys.stderr)
        return 2
    rows = [r for hidden in args.hidden.split(",")
            for r in measure(args.tokens, int(hidden), args.vocab, args.padded_vocab, args.warmup, args.iters)]
    for r in rows:
        print(f"{r['shape']:>18}  {r['what']:<42} {r['ms']:8.3f} ms")
    out = os.environ.get("GPTFORGE_BENCH_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "fp8_head.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
