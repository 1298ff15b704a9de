"""fused-layer-norm: the residual add + LayerNorm ops, as torch ops and as Triton kernels, and the GPT wired to them.

The torch implementation is held to autograd through F.layer_norm; the Triton kernels to the torch
implementation, on the CPU through Triton's interpreter (TRITON_INTERPRET=1, in a child process: the
variable must be set before Triton is imported) and on a GPU for real; the GPT with the key on to the
GPT with it off, eager and compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from gptforge.errors import UsageError
from gptforge.model import GPT, ModelConfig
from gptforge.model import kernels
from gptforge.model.layer_norm import (add_layer_norm, add_layer_norm_bwd, add_layer_norm_fwd, layer_norm_bwd,
                                       layer_norm_fwd)
from gptforge.model.layers import LayerBackend
from gptforge.train.config import TrainConfig, load_config, validate

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
CFG = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, max_position_embeddings=16, vocab_size=100)


def leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def grads_of(y, res_out, inputs, grad_y, grad_res):
    """The outputs and the gradients of INPUTS for the loss sum(y·grad_y) + sum(res_out·grad_res)."""
    ((y.float() * grad_y).sum() + (res_out.float() * grad_res).sum()).backward()
    return [y.detach(), res_out.detach()] + [None if t is None else t.grad for t in inputs]


@settings(max_examples=40, deadline=None)
@given(shape=st.sampled_from([(1, 2), (3, 7), (2, 5, 33), (4, 64)]), delta=st.sampled_from([None, "same", "bf16"]),
       wide=st.booleans(), seed=st.integers(0, 2**16), offset=st.sampled_from([0.0, 5.0]))
def test_the_torch_ops_are_the_add_and_layer_norm_of_autograd(shape, delta, wide, seed, offset):
    g = torch.Generator().manual_seed(seed)
    dtype = torch.float64 if wide else torch.float32
    res = torch.randn(shape, generator=g, dtype=dtype) + offset  # an offset: the mean matters
    d = None if delta is None else torch.randn(shape, generator=g).to(dtype if delta == "same" else torch.bfloat16)
    weight, bias = torch.randn(shape[-1], generator=g, dtype=dtype), torch.randn(shape[-1], generator=g, dtype=dtype)
    grad_y, grad_res = torch.randn(shape, generator=g, dtype=dtype), torch.randn(shape, generator=g, dtype=dtype)

    mine = leaves(res, d, weight, bias)
    got = grads_of(*add_layer_norm(*mine), mine, grad_y, grad_res)
    theirs = leaves(res, d, weight, bias)
    res_out = theirs[0] if d is None else theirs[0] + theirs[1]
    want = grads_of(F.layer_norm(res_out, shape[-1:], theirs[2], theirs[3], 1e-5), res_out, theirs, grad_y, grad_res)

    # float32 gradients lose digits to cancellation in proportion to 1/std (rows of nearly equal values)
    rstd = torch.rsqrt(res_out.detach().double().var(-1, unbiased=False) + 1e-5).max().item()
    tol = {"rtol": 1e-9, "atol": 1e-9} if wide else {"rtol": 2e-5, "atol": 2e-5 * max(1.0, rstd)}
    for name, a, b in zip(["y", "res_out", "d_res", "d_delta", "dw", "db"], got, want):
        if b is not None:
            assert a.dtype == b.dtype, name
            torch.testing.assert_close(a, b, **tol, msg=name)


def test_the_ops_make_new_tensors_in_the_dtypes_they_promise():
    res, delta = torch.randn(2, 3, 8), torch.randn(2, 3, 8).bfloat16()
    w, b = torch.ones(8), torch.zeros(8)
    y, mean, rstd = layer_norm_fwd(res, w, b, 1e-5, torch.bfloat16)
    assert (y.dtype, y.shape, mean.shape, rstd.dtype) == (torch.bfloat16, res.shape, (6,), torch.float32)
    y, res_out, _, _ = add_layer_norm_fwd(res, delta, w, b, 1e-5, torch.float32)
    assert res_out.dtype == torch.float32 and res_out.data_ptr() not in (res.data_ptr(), delta.data_ptr())
    y, same = add_layer_norm(res, None, w, b)
    assert same is res and y.dtype == torch.float32


@pytest.mark.parametrize("op, args", [
    (layer_norm_fwd, lambda r, d, w, b: (r, w, b, 1e-5, torch.float32)),
    (add_layer_norm_fwd, lambda r, d, w, b: (r, d, w, b, 1e-5, torch.float32)),
    (add_layer_norm_fwd, lambda r, d, w, b: (r, d.bfloat16(), w, b, 1e-5, torch.bfloat16)),
    (layer_norm_bwd, lambda r, d, w, b: (d, r, w, r.mean(-1).flatten(), r.std(-1).flatten(), None)),
    (add_layer_norm_bwd, lambda r, d, w, b: (d.bfloat16(), r, w, r.mean(-1).flatten(), r.std(-1).flatten(), d,
                                             torch.bfloat16)),
])
def test_the_ops_pass_torch_library_opcheck(op, args):
    """Schema, fake (what torch.compile traces), autograd registration and no aliasing, as torch checks them
    (the backward ops have no backward of their own: their inputs need none)."""
    torch.manual_seed(0)
    res, delta = torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    weight, bias = torch.randn(16), torch.randn(16)
    if op in (layer_norm_fwd, add_layer_norm_fwd):
        for t in (res, delta, weight, bias):
            t.requires_grad_()
    torch.library.opcheck(op, args(res, delta, weight, bias))


INTERPRETED = r"""
import json, torch
from gptforge.model import layer_norm as L
cases = []
for shape, delta_dtype, out_dtype, with_d_res in [
        ((10, 768), None, torch.float32, False),                    # the first LayerNorm: nothing to add
        ((2, 5, 768), torch.bfloat16, torch.bfloat16, True),        # the model's case: bf16 branch, bf16 output
        ((7, 100), torch.float32, torch.float32, True),             # odd width: a block of 128, 28 columns masked
        ((3, 100), torch.bfloat16, torch.bfloat16, False)]:         # fewer rows than programs; ln_f: no res_out gradient
    g = torch.Generator().manual_seed(shape[-1] * len(shape))
    res = torch.randn(shape, generator=g) * 2 + 1
    delta = None if delta_dtype is None else torch.randn(shape, generator=g).to(delta_dtype)
    w, b = torch.randn(shape[-1], generator=g), torch.randn(shape[-1], generator=g)
    dy = torch.randn(shape, generator=g).to(out_dtype)
    d_res = torch.randn(shape, generator=g) if with_d_res else None
    got = L.forward_triton(res, delta, w, b, 1e-5, out_dtype)
    ref = L.forward_torch(res, delta, w, b, 1e-5, out_dtype)
    got_b = L.backward_triton(dy, got[1], w, got[2], got[3], d_res, delta_dtype)
    ref_b = L.backward_torch(dy, ref[1], w, ref[2], ref[3], d_res, delta_dtype)
    rows = res.numel() // shape[-1]
    case = {"shape": shape, "out": str(out_dtype), "programs": L.backward_programs(rows, res.device),
            "dtypes": [str(t.dtype) for t in (*got, *got_b) if t is not None]}
    for name, a, r in zip(["y", "res_out", "mean", "rstd", "dx", "d_delta", "dw", "db"], (*got, *got_b), (*ref, *ref_b)):
        if r is not None:
            case[name] = [(a.float() - r.float()).abs().max().item(), r.float().abs().max().item(), str(a.dtype) == str(r.dtype)]
    cases.append(case)
print("CASES " + json.dumps(cases))
"""


def triton_path() -> str | None:
    """Where Triton can be imported from, or None (CI installs it in .ci/triton; a CUDA torch brings it)."""
    extra = os.environ.get("GPTFORGE_TRITON_DIR", str(ROOT / ".ci" / "triton"))
    probe = subprocess.run([sys.executable, "-c", "import triton"], capture_output=True,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join([extra, os.environ.get("PYTHONPATH", "")])})
    return extra if probe.returncode == 0 else None


BF16_ULP = 2 ** -7  # both sides rounded to bf16 may differ by one unit in the last place


def test_the_triton_kernels_compute_what_the_torch_ops_do_in_the_interpreter():
    extra = triton_path()
    if extra is None:
        pytest.skip("Triton is not importable here (.ci/run installs it in .ci/triton)")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), extra, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", INTERPRETED], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cases = json.loads(proc.stdout.split("CASES ", 1)[1])
    assert [case["programs"] for case in cases] == [[4, 3], [4, 3], [4, 2], [3, 1]]  # rows 10, 10, 7, 3 on 4 programs
    for case in cases:
        bf16 = case["out"] == "torch.bfloat16"
        for name in ("y", "res_out", "mean", "rstd", "dx", "d_delta", "dw", "db"):
            if name not in case:
                continue
            error, scale, same_dtype = case[name]
            rounded = bf16 and name in ("y", "d_delta")
            assert same_dtype, (name, case)
            assert error <= (BF16_ULP if rounded else 2e-6) * scale, (name, case)
        assert case["res_out"][0] == 0.0  # the same float32 add


# ---- the GPT -------------------------------------------------------------------------------------------------

def unfused_forward(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """The logits as the GPT made them before each residual add moved into the LayerNorm after it."""
    x = model.drop(model.wte(idx) + model.wpe(torch.arange(idx.shape[1])))
    for block in model.blocks:
        x = x + block.attn(block.ln_1(x))
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(model.ln_f(x))[..., : model.cfg.vocab_size]


def models() -> tuple[GPT, GPT]:
    """The default GPT and one with the key on, the same weights (LayerNorm gains and biases off their init)."""
    torch.manual_seed(0)
    reference = GPT(CFG)
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if ".ln_" in name or name.startswith("ln_"):
                param.add_(torch.randn_like(param) * 0.1)
    fused = GPT(CFG, LayerBackend(layer_norm="fused"))
    fused.load_state_dict(reference.state_dict())
    return reference, fused


def test_the_default_gpt_computes_what_it_did_before_the_adds_moved():
    reference, _ = models()
    x = torch.randint(0, CFG.vocab_size, (2, 16))
    assert torch.equal(reference(x)[0], unfused_forward(reference, x))


def test_checkpoints_load_both_ways():
    reference, fused = models()
    assert list(fused.state_dict()) == list(reference.state_dict())
    assert {"ln_f.weight", "ln_f.bias", "blocks.1.ln_1.weight", "blocks.1.ln_2.bias"} <= set(fused.state_dict())
    GPT(CFG).load_state_dict(fused.state_dict())
    GPT(CFG, LayerBackend(layer_norm="fused")).load_state_dict(reference.state_dict())


@pytest.mark.parametrize("compiled", [False, True])
def test_the_gpt_with_the_key_on_computes_what_the_default_does(compiled):
    """Compiled: fullgraph, so the ops trace without a graph break (aot_eager: inductor takes ~30 s on a CPU)."""
    reference, fused = models()
    x = torch.randint(0, CFG.vocab_size, (2, 16))
    losses = []
    for model in (reference, fused):
        run = torch.compile(model, backend="aot_eager", fullgraph=True) if compiled else model
        loss = run(x, x)[1]
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
    for (name, mine), theirs in zip(fused.named_parameters(), reference.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-6, msg=name)


# ---- the key and its note --------------------------------------------------------------------------------------

def test_the_key_is_off_by_default_and_takes_a_bool():
    assert TrainConfig().fused_layer_norm is False
    cfg, _ = load_config("gpt2-tiny", ["fused-layer-norm=true"])
    validate(cfg)
    assert cfg.fused_layer_norm is True
    with pytest.raises(UsageError, match="fused-layer-norm must be bool"):
        load_config("gpt2-tiny", ["fused-layer-norm=2"])


CUDA = torch.device("cuda")  # only its type is read


@pytest.mark.parametrize("layer_norm, device, width, triton, says", [
    ("te", CUDA, 768, True, "TransformerEngine layers are on: TE's LayerNorm"),
    ("apex", CUDA, 768, True, "apex FusedLayerNorm is on: apex's LayerNorm"),
    ("torch", CPU, 768, True, "needs a CUDA GPU: torch LayerNorm"),
    ("torch", CUDA, 12288, True, "takes hidden-size up to 8192, not 12288: torch LayerNorm"),
    ("torch", CUDA, 768, False, "Triton is not importable: torch LayerNorm"),
])
def test_the_fused_layer_norm_falls_back_and_says_why(monkeypatch, layer_norm, device, width, triton, says):
    monkeypatch.setattr(kernels, "triton_available", lambda: triton)
    backend = LayerBackend(layer_norm=layer_norm)
    assert kernels.use_fused_layer_norm(backend, device, True, width) == f"fused LayerNorm asked for but {says}"
    assert backend.layer_norm == layer_norm


def test_the_fused_layer_norm_is_on_where_it_can_run(monkeypatch):
    monkeypatch.setattr(kernels, "triton_available", lambda: True)
    backend = LayerBackend()
    assert kernels.use_fused_layer_norm(backend, CPU, False, 768) is None and backend.layer_norm == "torch"
    assert kernels.use_fused_layer_norm(backend, CUDA, True, 768) == \
        "LayerNorm: residual add + LayerNorm in one Triton kernel each way"
    assert backend.layer_norm == "fused"


def test_the_trainer_logs_the_fallback_on_a_cpu(tmp_path):
    cmd = [sys.executable, "-m", "gptforge", "train", "--config", "gpt2-tiny", "--device", "cpu", "--json",
           "--run-dir", str(tmp_path / "run"), "train-iters=2", "lr-warmup-iters=1", "fused-layer-norm=true",
           f"data-cache-dir={tmp_path / 'data'}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fused LayerNorm asked for but needs a CUDA GPU: torch LayerNorm" in json.loads(proc.stdout)["notes"]


# ---- on a GPU ----------------------------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("with_delta", [False, True])
def test_on_gpu_the_kernels_match_the_reference_at_gpt2_width(with_delta):
    """32 x 1024 tokens of width 768 under bf16 autocast, as the model runs them, against float32 F.layer_norm."""
    from gptforge.model.layer_norm import triton_available

    assert triton_available()
    torch.manual_seed(0)
    shape = (32, 1024, 768)
    res = torch.randn(shape, device="cuda") * 2 + 1
    delta = torch.randn(shape, device="cuda").bfloat16() if with_delta else None
    weight, bias = torch.randn(768, device="cuda") * 0.1 + 1, torch.randn(768, device="cuda") * 0.1
    grad_y, grad_res = torch.randn(shape, device="cuda"), torch.randn(shape, device="cuda")
    mine = leaves(res, delta, weight, bias)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y, res_out = add_layer_norm(*mine)
    assert (y.dtype, res_out.dtype) == (torch.bfloat16, torch.float32)
    got = grads_of(y, res_out, mine, grad_y, grad_res)
    theirs = leaves(res, delta, weight, bias)
    res_out = theirs[0] if delta is None else theirs[0] + theirs[1]
    y = F.layer_norm(res_out, (768,), theirs[2], theirs[3], 1e-5).bfloat16()  # autocast runs it in float32
    want = grads_of(y, res_out, theirs, grad_y, grad_res)
    for name, a, b in zip(["y", "res_out", "d_res", "d_delta", "dw", "db"], got, want):
        if b is None:
            continue
        assert a.dtype == b.dtype, name
        rounded = name in ("y", "d_delta")
        tol = BF16_ULP if rounded else 1e-4 if name in ("dw", "db") else 1e-5
        assert (a.float() - b.float()).abs().max().item() <= tol * b.float().abs().max().item(), name


@pytest.mark.gpu
@cuda
def test_on_gpu_compiled_training_with_the_key_lands_where_the_default_does(tmp_path):
    run = ["--config", "gpt2-tiny", "--device", "cuda", "--json", "precision=bf16", "compile=true", "train-iters=60",
           "save-interval=60", "eval-interval=60", f"data-cache-dir={tmp_path / 'data'}"]
    results = {}
    for name, keys in (("default", []), ("fused", ["fused-layer-norm=true"])):
        proc = subprocess.run([sys.executable, "-m", "gptforge", "train", *run, "--run-dir", str(tmp_path / name), *keys],
                              capture_output=True, text=True, timeout=900, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        results[name] = json.loads(proc.stdout)
    assert "LayerNorm: residual add + LayerNorm in one Triton kernel each way" in results["fused"]["notes"]
    assert results["fused"]["final_val_loss"] < results["fused"]["first_val_loss"] - 0.5
    assert results["fused"]["final_val_loss"] == pytest.approx(results["default"]["final_val_loss"], abs=0.05)
