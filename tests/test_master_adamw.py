"""bf16-weights: AdamW over bf16 model weights with float32 masters (train/master.py, train/adamw_bf16.py).

Held to torch's AdamW on float32 weights given the same gradients; the accumulation of bf16 gradients to
autograd's float32 one; the checkpoint round trip to float32 masters; the Triton kernel to its torch ops in
Triton's interpreter and on a GPU; and the trainer with the key on against off on a GPU.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import pooled_parity
from test_xent_kernel import interpreted_cases

from gptforge.model import GPT, ModelConfig
from gptforge.train.config import load_config
from gptforge.train.master import MOMENTS, MasterAdamW, float32_weights, without_masters
from gptforge.train.optim import StepShape, bf16_weights_blocker, build_optimizer, clipped_step, lr_at, param_groups

SMALL = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=2, max_position_embeddings=16, vocab_size=100)


def twin_models(seed: int = 0) -> tuple[GPT, GPT]:
    torch.manual_seed(seed)
    model = GPT(SMALL)
    twin = GPT(SMALL)
    twin.load_state_dict(model.state_dict())
    return model, twin


def master_adamw(model: GPT, accumulate: bool = False) -> MasterAdamW:
    groups = param_groups(model, 0.1)
    return MasterAdamW(groups, groups[0]["params"], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, accumulate=accumulate,
                       fused=False)


def test_the_weight_matrices_become_bf16_and_the_rest_stays_float32():
    model, _ = twin_models()
    opt = master_adamw(model)
    low = {n for n, p in model.named_parameters() if p.dtype == torch.bfloat16}
    assert low == {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    assert model.wte.weight.dtype == model.blocks[0].attn.qkv.bias.dtype == torch.float32
    weight = model.blocks[0].mlp.fc.weight
    assert torch.equal(weight, opt.state[weight]["master"].to(torch.bfloat16))


@pytest.mark.parametrize("max_norm", [0.05, 1e6])
def test_steps_as_torch_adamw_on_float32_weights_given_the_same_gradients(max_norm):
    ref_model, model = twin_models()
    ref_params, params = list(ref_model.parameters()), list(model.parameters())
    ref = torch.optim.AdamW(param_groups(ref_model, 0.1), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, fused=True)
    opt = master_adamw(model)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        for ref_p, p in zip(ref_params, params):
            grad = torch.randn(p.shape, generator=g).to(torch.bfloat16)  # what a bf16 GEMM hands back
            ref_p.grad, p.grad = grad.float(), grad.to(p.dtype)
        ref_norm = clipped_step(ref, ref_params, max_norm)
        norm = clipped_step(opt, params, max_norm)
        torch.testing.assert_close(norm, ref_norm, rtol=1e-6, atol=0)
        ref.zero_grad()
        opt.zero_grad()
    for ref_p, p in zip(ref_params, params):
        value = opt.state[p]["master"] if p.dtype == torch.bfloat16 else p
        torch.testing.assert_close(value, ref_p.detach(), rtol=2e-6, atol=2e-7)
        if p.dtype == torch.bfloat16:
            assert torch.equal(p, value.to(torch.bfloat16))


def test_under_bf16_autocast_the_bf16_weights_give_the_float32_weights_loss_and_gradients_bit_for_bit():
    ref_model, model = twin_models(4)
    master_adamw(model)
    assert model.blocks[0].mlp.fc.weight.dtype == torch.bfloat16
    idx = torch.randint(0, 100, (3, 16), generator=torch.Generator().manual_seed(4))
    losses = []
    for m in (ref_model, model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            losses.append(m(idx, idx)[1])
        losses[-1].backward()
    assert torch.equal(*losses)
    for (name, ref_p), p in zip(ref_model.named_parameters(), model.parameters()):
        assert torch.equal(p.grad.float(), ref_p.grad), name


def test_accumulated_bf16_gradients_sum_to_autograds_float32_sum():
    ref_model, model = twin_models(2)
    opt = master_adamw(model, accumulate=True)
    batches = [torch.randint(0, 100, (3, 16)) for _ in range(3)]
    for step in range(2):
        for idx in batches:
            for m in (ref_model, model):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    _, loss = m(idx, idx)
                loss.backward()
        fc = model.blocks[1].mlp.fc.weight
        assert fc.grad is None  # handed over to the float32 sum
        sums = dict(zip(map(id, (p for p in model.parameters() if p.grad is None)), opt.gradients()))
        assert torch.equal(sums[id(fc)], ref_model.blocks[1].mlp.fc.weight.grad)
        for ref_p, p in zip(ref_model.parameters(), model.parameters()):
            if p.dtype == torch.bfloat16:
                assert torch.equal(opt.sums[id(p)], ref_p.grad)
        ref_model.zero_grad()
        opt.zero_grad()
        assert all(not s.any() for s in opt.sums.values())


def test_the_checkpoint_round_trip_keeps_float32_masters_and_moments():
    model, fresh = twin_models(3)
    opt = master_adamw(model)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    model_state, opt_state = opt.model_state(model), opt.state_dict()
    assert model_state["blocks.0.attn.qkv.weight"].dtype == torch.float32  # model.pt stays float32
    fresh_opt = master_adamw(fresh)
    fresh.load_state_dict(model_state)
    fresh_opt.load_state_dict(opt_state)
    for p, q in zip(model.parameters(), fresh.parameters()):
        assert p.dtype == q.dtype and torch.equal(p, q)
        for name, value in opt.state[p].items():
            loaded = fresh_opt.state[q][name]
            assert loaded.dtype == value.dtype and torch.equal(loaded, value), name
    assert fresh_opt.state[fresh.blocks[0].mlp.fc.weight]["master"].dtype == torch.float32


def _random_grads(params: list[torch.Tensor], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(torch.bfloat16).to(p.dtype)


def _saved(state: dict) -> dict:
    """STATE as a checkpoint gives it back: copies, shared with nothing (torch's loader keeps CPU tensors as given)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_either_optimizer_resumes_the_others_checkpoint():
    """A run that began with float32 weights goes on with bf16-weights (a key given on resume, or hopper-kernels
    adding it), and back: the masters come from the checkpoint's float32 weights, the moments carry over."""
    ref_model, model = twin_models(4)
    ref = torch.optim.AdamW(param_groups(ref_model, 0.1), lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    _random_grads(list(ref_model.parameters()), 0)
    ref.step()
    model_state, opt_state = _saved(ref_model.state_dict()), _saved(ref.state_dict())
    opt = master_adamw(model)
    model.load_state_dict(model_state)
    opt.load_state_dict(opt_state, float32_weights(model, model_state))
    for p, q in zip(ref_model.parameters(), model.parameters()):
        state = opt.state[q]
        assert "master" not in state or torch.equal(state["master"], p.detach())
        assert all(state[m].dtype == torch.float32 and torch.equal(state[m], ref.state[p][m]) for m in MOMENTS)
    with pytest.raises(ValueError, match="no float32 masters"):
        master_adamw(twin_models(4)[1]).load_state_dict(opt_state)
    for seed in (1, 2):  # the resumed run steps as the float32 one goes on
        _random_grads(list(ref_model.parameters()), seed)
        _random_grads(list(model.parameters()), seed)
        ref.step()
        opt.step()
    for p, q in zip(ref_model.parameters(), model.parameters()):
        torch.testing.assert_close(opt.state[q]["master"] if q.dtype == torch.bfloat16 else q, p.detach(),
                                   rtol=2e-6, atol=2e-7)
    back_model = GPT(SMALL)
    back_model.load_state_dict(_saved(opt.model_state(model)))
    back = torch.optim.AdamW(param_groups(back_model, 0.1), lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    back.load_state_dict(without_masters(_saved(opt.state_dict())))
    assert all("master" not in state for state in back.state.values())
    for p, q, r in zip(ref_model.parameters(), back_model.parameters(), model.parameters()):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=2e-6, atol=2e-7)
        assert all(torch.equal(back.state[q][m], opt.state[r][m]) for m in MOMENTS)


def test_where_it_cannot_apply_the_note_says_why_and_torch_adamw_runs():
    cfg, _ = load_config("gpt2-tiny", ["bf16-weights=true"])
    cuda = torch.device("cuda")
    assert bf16_weights_blocker(cfg, cuda, StepShape("bf16")) is None
    assert "DDP" in bf16_weights_blocker(cfg, cuda, StepShape("bf16", ddp=True))
    assert "DeepSpeed" in bf16_weights_blocker(cfg, cuda, StepShape("bf16", deepspeed=True))
    assert "fp16" in bf16_weights_blocker(cfg, cuda, StepShape("fp16"))
    float8, _ = load_config("gpt2-tiny", ["bf16-weights=true", "float8=tensorwise"])
    assert "float8" in bf16_weights_blocker(float8, cuda, StepShape("bf16"))
    opt, note = build_optimizer(GPT(SMALL), cfg, torch.device("cpu"), StepShape("fp32"))
    assert type(opt) is torch.optim.AdamW
    assert note.startswith("bf16-weights asked for but off (the run is fp32 on cpu")
    from_hopper_keys = replace(load_config("gpt2-tiny")[0], bf16_weights=True)  # hopper-kernels sets it, no one gave it
    from_hopper_keys.given = frozenset()
    _, note = build_optimizer(GPT(SMALL), from_hopper_keys, torch.device("cpu"), StepShape("fp32"))
    assert note.startswith("bf16-weights (hopper-kernels) off (the run is fp32 on cpu")


INTERPRETED = r"""
import json, torch
from gptforge.train import adamw_bf16 as A
cases = []
for n, grad_dtype, scale in [(5000, torch.bfloat16, None), (2048, torch.float32, 3.0), (7, torch.bfloat16, 0.5)]:
    g = torch.Generator().manual_seed(n)
    master = torch.randn(n, generator=g)
    avg, avg_sq = torch.randn(n, generator=g) * 0.1, torch.rand(n, generator=g) * 0.01
    grad = torch.randn(n, generator=g).to(grad_dtype)
    hyper = A.Hyper(lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, step=3)
    scale_t = None if scale is None else torch.tensor(scale)
    ref = [t.clone() for t in (master, avg, avg_sq)]
    ref_weight, weight = torch.empty(n, dtype=torch.bfloat16), torch.empty(n, dtype=torch.bfloat16)
    A.adamw_bf16_torch(ref_weight, grad, *ref, hyper, scale_t)
    A._launch(weight, grad, master, avg, avg_sq, hyper, scale_t)
    cases.append({"n": n, "master": ((master - ref[0]).abs() / ref[0].abs().clamp_min(1e-3)).max().item(),
                  "moments": max((avg - ref[1]).abs().max().item(), (avg_sq - ref[2]).abs().max().item()),
                  "weight_ulps": ((weight.float() - master).abs() / master.abs().clamp_min(1e-30)).max().item() * 2 ** 7,
                  "moved": (master - ref_weight.float()).abs().max().item() > 0})
print("CASES " + json.dumps(cases))
"""


def test_the_triton_kernel_computes_what_the_torch_ops_do_in_the_interpreter():
    cases = interpreted_cases(INTERPRETED)
    assert [c["n"] for c in cases] == [5000, 2048, 7]
    for case in cases:
        assert case["master"] < 1e-5 and case["moments"] < 1e-7, case
        # the interpreter truncates to bf16 where the GPU rounds to nearest even (the GPU test checks that)
        assert case["weight_ulps"] <= 1 and case["moved"], case


@pytest.mark.gpu
@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float32])
def test_on_gpu_the_kernel_matches_its_torch_ops_and_writes_the_rounded_master(grad_dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    from gptforge.train.adamw_bf16 import Hyper, _launch, adamw_bf16_torch

    torch.manual_seed(0)
    n = 768 * 3072 + 5
    master = torch.randn(n, device="cuda")
    avg, avg_sq = torch.randn(n, device="cuda") * 0.1, torch.rand(n, device="cuda") * 0.01
    grad = torch.randn(n, device="cuda").to(grad_dtype)
    hyper, scale = Hyper(3e-4, 0.1, 0.9, 0.95, 1e-8, 7), torch.tensor(1.7, device="cuda")
    ref = [t.clone() for t in (master, avg, avg_sq)]
    weight, ref_weight = (torch.empty(n, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    adamw_bf16_torch(ref_weight, grad, *ref, hyper, scale)
    _launch(weight, grad, master, avg, avg_sq, hyper, scale)
    torch.testing.assert_close(master, ref[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(avg_sq, ref[2], rtol=1e-6, atol=0)
    assert torch.equal(weight, master.to(torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("accum", [1, 2])
def test_on_gpu_training_with_bf16_weights_follows_float32_weights(accum):
    """The trainer (compiled, CUDA graphs) with the key on against off: after the first step the masters are
    the float32 weights and the bf16 weights their rounding; 30 steps later both have learned alike. (Adam
    turns rounding differences of near-zero gradients into lr-sized ones, so later steps drift apart by a
    few hundredths; a wrong update would not learn, or learn differently, by tenths.)"""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    from gptforge.train.adamw_bf16 import kernel_available

    assert kernel_available(torch.device("cuda"))
    off, on = (tiny_trainer([f"bf16-weights={key}", f"global-batch-size={8 * accum}"]) for key in ("false", "true"))
    assert isinstance(on.engine.optimizer, MasterAdamW) and not isinstance(off.engine.optimizer, MasterAdamW)
    losses = {id(t): [t.train_step()["loss"]] for t in (off, on)}
    assert abs(losses[id(on)][0] - losses[id(off)][0]) < 1e-3  # same weights, same first forward
    first_lr = lr_at(0, on.cfg)
    for (name, ref), p in zip(off.model.named_parameters(), on.model.parameters()):
        if p.dtype == torch.bfloat16:
            master = on.engine.optimizer.state[p]["master"]
            diff = (master - ref.detach()).abs()
            apart = (diff > 1e-6 + 1e-5 * ref.detach().abs()).float().mean().item()
            # a first Adam step moves each weight by at most lr (its update is g / (|g| + eps)): where a
            # near-zero gradient's rounding flips its sign, the two runs differ by up to twice that. At
            # initialization the key projection's gradient is mostly such (on the H100: 0.9% of the qkv
            # weights); a wrong update would move nearly all of them
            assert apart < 0.05 and diff.max().item() <= 2.01 * first_lr, (name, apart, diff.max().item(), first_lr)
            assert torch.equal(p, master.to(torch.bfloat16)), name
    for t in (off, on):
        losses[id(t)] += [t.train_step()["loss"] for _ in range(29)]
    off_loss, on_loss = losses[id(off)], losses[id(on)]
    assert off_loss[0] - off_loss[-1] > 0.5
    assert max(abs(a - b) for a, b in zip(on_loss, off_loss)) < 0.3, (on_loss, off_loss)
    assert abs(sum(on_loss[-5:]) - sum(off_loss[-5:])) / 5 < 0.15, (on_loss, off_loss)


@pytest.mark.gpu
@pytest.mark.parametrize("before, after", [("false", "true"), ("true", "false")])
def test_on_gpu_a_run_resumes_with_bf16_weights_switched(tmp_path, before, after):
    """The trainer's checkpoint of one optimizer resumed by the other: a run begun without bf16-weights that
    hopper-kernels (or a key given on resume) turns it on for, and back."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    keys = ["eval-interval=4", "save-interval=4", "compile=false", f"data-cache-dir={tmp_path / 'data'}"]

    def train(iters: int, bf16_weights: str, *resume: str) -> dict:
        cmd = [sys.executable, "-m", "gptforge", "train", "--config", "gpt2-tiny", "--device", "cuda", "--json",
               "--run-dir", str(tmp_path / "run"), *resume, *keys, f"train-iters={iters}", f"bf16-weights={bf16_weights}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)

    first = train(4, before)
    resumed = train(8, after, "--resume")
    assert resumed["resumed_from"] == 4
    assert any("bf16-weights" in note and note.startswith("resume:") for note in resumed["notes"])
    masters = [any("float32 master weights" in note for note in run["notes"]) for run in (first, resumed)]
    assert masters == [before == "true", after == "true"]
    assert resumed["final_val_loss"] < first["final_val_loss"]


def tiny_trainer(overrides: list[str]):
    from rich.console import Console

    from gptforge.train.loop import RunOptions, Trainer

    cfg, _ = load_config("gpt2-tiny", ["train-iters=30", "micro-batch-size=8", "compile=true",
                                       "compile-mode=reduce-overhead", "eval-interval=1000", *overrides])
    trainer = Trainer(cfg, RunOptions(run_dir=Path(f"/tmp/bf16w-{'-'.join(overrides)}"), config_name="gpt2-tiny",
                                      device="cuda"), console=Console(quiet=True))
    trainer.preflight()
    trainer.setup()
    return trainer


def test_the_committed_parity_runs_give_the_figures_benchmarks_quotes():
    """BENCHMARKS.md, run 91: bf16-weights' four seeds pooled against the float32 weights' runs."""
    (pooled,) = pooled_parity("bf16-weights", "bf16-weights=false", "run91-*.json")["configs"].values()
    assert (pooled["runs"], round(pooled["mean"], 4), round(pooled["stderr"], 4)) == (4, 0.0138, 0.0058)
    assert (round(pooled["val_diff"]["mean"], 4), round(pooled["val_diff"]["stderr"], 4)) == (0.039, 0.0046)


def test_the_parity_runs_of_the_config_with_bf16_weights_give_the_figures_benchmarks_quotes():
    """BENCHMARKS.md, runs 103-105: eight seeds of bf16-weights against the config as it trained without it, and
    four reruns of that config (A's run-to-run deviation)."""
    report = pooled_parity("bf16-weights", "bf16-weights=false", "run10[345]-*.json")
    (pooled,) = report["configs"].values()
    assert (pooled["runs"], round(pooled["mean"], 4), round(pooled["stderr"], 4), round(pooled["rms"], 4)) == \
        (8, -0.0023, 0.0054, 0.0145)
    assert (round(pooled["val_diff"]["mean"], 4), round(pooled["val_diff"]["stderr"], 4)) == (-0.002, 0.0081)
    assert (round(report["noise"]["sd"], 4), report["noise"]["dof"]) == (0.0054, 4)
