"""The fused (chunked) output layer + cross-entropy gives the reference's loss and gradients."""

from __future__ import annotations

import pytest
import torch

from gpt_pairs import ReferenceLoss
from gptforge.model.config import ModelConfig
from gptforge.model.gpt import GPT
from gptforge.model.loss import FusedLoss, linear_cross_entropy

CFG = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, max_position_embeddings=32, vocab_size=500)


def twin_models(chunk: int, cfg: ModelConfig = CFG) -> tuple[GPT, GPT]:
    """The same weights twice: one taking its loss from whole logits, one from the fused loss in chunks of CHUNK."""
    torch.manual_seed(0)
    ref = GPT(cfg)
    ref.loss = ReferenceLoss(cfg.vocab_size)
    fused = GPT(cfg)
    fused.loss = FusedLoss(cfg.vocab_size, chunk)
    fused.load_state_dict(ref.state_dict())
    return ref, fused


def batch(rows: int = 3, seq: int = 32):
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, CFG.vocab_size, (rows, seq), generator=g)
    return idx, torch.randint(0, CFG.vocab_size, (rows, seq), generator=g)


def loss_and_grads(model: GPT, x, y, autocast: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        _, loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("chunk", [7, 40, 96, 4096])  # uneven last chunk, several, one chunk, larger than the batch
def test_fp32_loss_and_every_gradient_match_the_reference(chunk):
    ref, fused = twin_models(chunk)
    x, y = batch()
    loss_r, grads_r = loss_and_grads(ref, x, y, autocast=False)
    loss_f, grads_f = loss_and_grads(fused, x, y, autocast=False)
    assert loss_f.item() == pytest.approx(loss_r.item(), rel=1e-6)
    assert grads_f.keys() == grads_r.keys()
    for name, g in grads_r.items():
        torch.testing.assert_close(grads_f[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_bf16_autocast_matches_the_reference_within_bf16_rounding():
    ref, fused = twin_models(40)
    x, y = batch()
    loss_r, grads_r = loss_and_grads(ref, x, y, autocast=True)
    loss_f, grads_f = loss_and_grads(fused, x, y, autocast=True)
    assert loss_f.dtype == torch.float32
    assert loss_f.item() == pytest.approx(loss_r.item(), rel=1e-3)
    for name, g in grads_r.items():
        assert grads_f[name].dtype == g.dtype
        # bf16 has 8 bits of mantissa: compare relative to the gradient's scale
        err = (grads_f[name] - g).abs().max() / g.abs().max().clamp_min(1e-12)
        assert err < 2e-2, f"{name}: max error {err:.3g} of its scale"


def test_padded_vocabulary_rows_get_no_probability_and_no_gradient():
    ref, fused = twin_models(50)
    assert CFG.padded_vocab_size > CFG.vocab_size
    x, y = batch()
    _, grads = loss_and_grads(fused, x, y, autocast=False)
    assert torch.count_nonzero(grads["wte.weight"][CFG.vocab_size:]) == 0  # only the embedding of no token there
    # a huge padded-row weight would dominate an uncut softmax; the loss must not move
    with torch.no_grad():
        before = fused(x, y)[1]
        fused.wte.weight[CFG.vocab_size:] = 100.0
        after = fused(x, y)[1]
    assert after.item() == pytest.approx(before.item(), rel=1e-6)


def test_eval_without_grad_gives_the_same_loss_and_no_logits():
    ref, fused = twin_models(33)
    x, y = batch()
    with torch.no_grad():
        _, loss_r = ref(x, y)
        logits_f, loss_f = fused(x, y)
    assert logits_f is None
    assert loss_f.item() == pytest.approx(loss_r.item(), rel=1e-6)
    assert fused(x)[0].shape == (*x.shape, CFG.vocab_size)  # sampling still gets logits


def test_function_level_matches_torch_cross_entropy():
    torch.manual_seed(3)
    h = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(24, 16, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 20, (50,))
    ref = torch.nn.functional.cross_entropy((h @ w.t())[:, :20], t)
    gh, gw = torch.autograd.grad(ref * 3.0, (h, w))
    ours = linear_cross_entropy(h, w, t, 20, 8)
    fh, fw = torch.autograd.grad(ours * 3.0, (h, w))  # an upstream gradient other than 1 scales both
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(fh, gh)
    torch.testing.assert_close(fw, gw)


def compiled_step(backend: str, chunk: int):
    """(graph breaks, loss, token-table gradient) of one compiled training step, and the eager ones."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    _, model = twin_models(chunk)
    x, y = batch()
    eager_loss, eager_grads = loss_and_grads(model, x, y, autocast=False)
    model.zero_grad(set_to_none=True)
    _, loss = torch.compile(model, backend=backend)(x, y)
    loss.backward()
    breaks = sum(counters["graph_break"].values())
    return breaks, (loss.item(), eager_loss.item()), (model.wte.weight.grad, eager_grads["wte.weight"])


def test_fused_loss_traces_without_graph_breaks():
    # aot_eager: dynamo + AOTAutograd (where graph breaks and autograd.Function tracing happen), no codegen
    breaks, (loss, eager), (grad, eager_grad) = compiled_step("aot_eager", 40)
    assert breaks == 0
    assert loss == pytest.approx(eager, rel=1e-5)
    torch.testing.assert_close(grad, eager_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_fused_loss_under_inductor_matches_eager():
    breaks, (loss, eager), (grad, eager_grad) = compiled_step("inductor", 40)
    assert breaks == 0
    assert loss == pytest.approx(eager, rel=1e-5)
    torch.testing.assert_close(grad, eager_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
def test_on_gpu_compiled_fused_loss_matches_the_compiled_reference_in_bf16():
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    cfg = ModelConfig(num_layers=2, hidden_size=256, num_attention_heads=4, max_position_embeddings=256, vocab_size=50257)
    ref, fused = (model.cuda() for model in twin_models(2048, cfg))
    x = torch.randint(0, cfg.vocab_size, (8, 256), device="cuda")
    y = torch.randint(0, cfg.vocab_size, (8, 256), device="cuda")
    results = []
    for model in (ref, fused):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = torch.compile(model)(x, y)
        loss.backward()
        results.append((loss.item(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_r, grads_r), (loss_f, grads_f) = results
    assert loss_f == pytest.approx(loss_r, rel=1e-3)
    for name, g in grads_r.items():
        err = (grads_f[name] - g).abs().max() / g.abs().max().clamp_min(1e-12)
        assert err < 2e-2, f"{name}: max error {err:.3g} of its scale"
