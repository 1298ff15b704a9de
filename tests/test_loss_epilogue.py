"""The epilogue cross-entropy (loss-epilogue=true): when the trainer turns it on, and on an sm_90 GPU with
quack-kernels, its loss and gradients against float64 and a few training steps against the xent path."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import run_cli
from gptforge.model import kernels
from gptforge.model.layers import LayerBackend
from gptforge.model.lce_epilogue import epilogue_fits
from gptforge.model.loss import linear_cross_entropy

CPU = torch.device("cpu")
GPU_124M = {"precision": "bf16", "padded_vocab": 50304, "hidden": 768}


@pytest.fixture
def sm90_with_quack(monkeypatch):
    """The GPU and package checks pass on this machine: what is tested is every check around them."""
    monkeypatch.setattr(kernels, "hopper", lambda device: True)
    monkeypatch.setattr(kernels, "hopper_or_blackwell", lambda device: True)
    monkeypatch.setattr(kernels, "QUACK_LCE_MODULE", "json")


def note(backend: LayerBackend, device=CPU, asked=True, **shape) -> str | None:
    return kernels.use_loss_epilogue(backend, device, asked, **{**GPU_124M, **shape})


def test_not_asked_for_it_says_nothing_and_changes_nothing():
    backend = LayerBackend(loss_chunk=32768)
    assert note(backend, asked=False) is None and not backend.loss_epilogue


@pytest.mark.parametrize("backend, shape, why", [
    (LayerBackend(), {}, "needs fused-loss=true"),
    (LayerBackend(loss_chunk=32768, loss_fp8=True), {}, "fp8-output is on and keeps the output layer"),
    (LayerBackend(loss_chunk=32768), {"precision": "fp16"}, "needs bf16 (the run is fp16)"),
    (LayerBackend(loss_chunk=1000), {}, "loss-chunk-tokens (1000) and the padded vocabulary (50304) must be multiples"),
    (LayerBackend(loss_chunk=32768), {"padded_vocab": 50264}, "the padded vocabulary (50264) must be multiples of 128"),
])
def test_it_falls_back_to_the_xent_kernel_with_the_reason(sm90_with_quack, backend, shape, why):
    said = note(backend, **shape)
    assert said.startswith("epilogue cross-entropy asked for but ") and why in said
    assert said.endswith(": gptforge's xent kernel") and not backend.loss_epilogue


def test_it_needs_an_sm90_gpu():
    backend = LayerBackend(loss_chunk=32768)
    assert note(backend) == "epilogue cross-entropy asked for but needs an sm_90 GPU: gptforge's xent kernel"


def test_on_an_sm90_gpu_without_quack_it_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(kernels, "hopper", lambda device: True)
    monkeypatch.setattr(kernels, "hopper_or_blackwell", lambda device: True)
    monkeypatch.setattr(kernels, "QUACK_LCE_MODULE", "gptforge_no_such_quack")
    said = note(LayerBackend(loss_chunk=32768))
    assert said.startswith("epilogue cross-entropy asked for but quack is not importable (ModuleNotFoundError: ")
    assert "pip install quack-kernels" in said


def test_with_everything_in_place_it_turns_on(sm90_with_quack):
    backend = LayerBackend(loss_chunk=32768)
    assert note(backend).startswith("loss: quack's scaled-exp linear cross-entropy")
    assert backend.loss_epilogue


@pytest.mark.parametrize("chunk, hidden, vocab, fits", [
    (32768, 768, 50304, True), (128, 8, 128, True), (32704, 768, 50304, False), (32768, 764, 50304, False),
    (32768, 768, 50257, False),
])
def test_the_shapes_it_takes(chunk, hidden, vocab, fits):
    assert epilogue_fits(chunk, hidden, vocab) is fits


def test_the_trainer_falls_back_with_the_note_on_a_cpu(tmp_path, train_data_cache):
    proc = run_cli("train", "--run-dir", str(tmp_path / "run"), "--config", "gpt2-tiny", "--device", "cpu", "--json",
                   "train-iters=2", "save-interval=2", "eval-interval=2", "fused-loss=true", "loss-epilogue=true",
                   f"data-cache-dir={train_data_cache}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = json.loads(proc.stdout)["notes"]
    assert "epilogue cross-entropy asked for but needs an sm_90 GPU: gptforge's xent kernel" in notes
    assert any(n.startswith("loss kernel: ") for n in notes)


def test_without_gradients_the_loss_spans_the_padded_vocabulary_as_in_training():
    torch.manual_seed(0)
    h, w = torch.randn(64, 16), torch.randn(256, 16)
    t = torch.randint(0, 200, (64,))
    with torch.no_grad():
        got = linear_cross_entropy(h, w, t, 200, 32, epilogue=True)
        real_vocabulary = linear_cross_entropy(h, w, t, 200, 32)
    torch.testing.assert_close(got, F.cross_entropy(h @ w.t(), t))
    assert got > real_vocabulary  # the padding's 56 columns take their share of the softmax


# ---- on an sm_90 GPU with quack-kernels --------------------------------------------------------------------------

sm90 = pytest.mark.skipif(not torch.cuda.is_available() or not kernels.hopper(torch.device("cuda"))
                          or importlib.util.find_spec("quack") is None, reason="needs an sm_90 GPU and quack-kernels")


def float64_reference(h, w, t, vocab: int):
    """Loss and gradients of softmax((h @ w^T)[:, :vocab]) in float64, from the bf16 operands the GEMMs see."""
    h64 = h.detach().bfloat16().double().requires_grad_()
    w64 = w.detach().bfloat16().double().requires_grad_()
    loss = F.cross_entropy((h64 @ w64.t())[:, :vocab], t)
    loss.backward()
    return loss.item(), h64.grad, w64.grad


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.gpu
@sm90
@pytest.mark.parametrize("confident", [False, True])
def test_on_gpu_loss_and_gradients_match_float64_over_the_padded_vocabulary(confident):
    torch.manual_seed(0)
    tokens, hidden, padded = 4096, 768, 50304
    h = (torch.randn(tokens, hidden, device="cuda")).requires_grad_()
    w = torch.randn(padded, hidden, device="cuda") * (0.2 if confident else 0.02)
    t = torch.randint(0, 50257, (tokens,), device="cuda")
    if confident:  # the target's logit well above the rest: softmax[target] - 1 is a small difference
        w[t] += h.detach() * 0.05
    w.requires_grad_()
    ref_loss, ref_h, ref_w = float64_reference(h, w, t, padded)
    errors = {}
    for name, epilogue in (("epilogue", True), ("xent", False)):
        h.grad = w.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            vocab = padded if epilogue else 50257
            loss = linear_cross_entropy(h, w, t, vocab, 2048, epilogue=epilogue)
        loss.backward()
        want_loss, want_h, want_w = (ref_loss, ref_h, ref_w) if epilogue else float64_reference(h, w, t, 50257)
        errors[name] = (abs(loss.item() - want_loss), relative_error(h.grad, want_h), relative_error(w.grad, want_w))
        assert w.grad.dtype == torch.float32
    loss_off, h_off, w_off = errors["epilogue"]
    # bf16's rounding (2^-9 = 2e-3 per entry) is the scale: E and the rescaled h are bf16, as the xent
    # path's gradient is; the xent path's own errors are in the message for comparison
    assert loss_off < 1e-3 and h_off < 5e-3 and w_off < 5e-3, errors


@pytest.mark.gpu
@sm90
def test_on_gpu_training_with_the_epilogue_lands_where_the_xent_path_does(tmp_path):
    run = ("--config", "gpt2-tiny", "--device", "cuda", "--json", "precision=bf16", "compile=true", "fused-loss=true",
           "train-iters=60", "save-interval=60", "eval-interval=60", f"data-cache-dir={tmp_path / 'data'}")
    results = {}
    for name, keys in (("xent", ()), ("epilogue", ("loss-epilogue=true",))):
        proc = run_cli("train", "--run-dir", str(tmp_path / name), *run, *keys, cwd=tmp_path, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = json.loads(proc.stdout)
    assert any(n.startswith("loss: quack's scaled-exp") for n in results["epilogue"]["notes"])
    assert results["epilogue"]["final_val_loss"] < results["epilogue"]["first_val_loss"] - 0.5  # it learned
    assert results["epilogue"]["final_val_loss"] == pytest.approx(results["xent"]["final_val_loss"], abs=0.1)
