"""gptforge.accel: the key picks one set of kernels; a set that cannot run here stops with the reason before
anything is written; the swapped modules compute what the model's own do (on the CPU through float32
stand-ins for FA4 and cuDNN, on an sm_90 GPU for real); the hopper environment trains the named config."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import run_cli, run_main
from gpt_pairs import TINY, assert_trains_as_the_default
from gptforge import accel
from gptforge.accel import attention, hopper
from gptforge.accel.attention import FlashAttention, cudnn_flash4_attention, cudnn_fwd, flash4_bwd
from gptforge.core.installed import dsl_directory, outside_site_packages
from gptforge.errors import UsageError
from gptforge.model.gpt import GPT
from gptforge.model.loss import linear_cross_entropy
from gptforge.probe.machine import Machine
from gptforge.probe.packages import probe_hopper_kernels
from gptforge.train.config import load_config, validate

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def test_a_choice_outside_the_four_is_refused():
    with pytest.raises(UsageError, match="^accel: 'fast' is not one of none, triton, hopper, te-fp8$"):
        validate(load_config("gpt2-tiny", ["accel=fast"])[0])


def test_the_named_hopper_config_is_gpt2_124m_with_accel_hopper():
    assert load_config("gpt2-124m-hopper")[0] == load_config("gpt2-124m", ["accel=hopper"])[0]
    assert {load_config(name)[0].accel for name in ("gpt2-tiny", "gpt2-124m", "gpt2-350m", "gpt2-774m")} == {"triton"}


@pytest.mark.parametrize("choice, says", [
    ("hopper", "accel: hopper: its kernels need an sm_90 GPU (H100, H200)"),
    ("te-fp8", "accel: te-fp8: FP8 needs an sm_89 or newer GPU"),
])
def test_a_set_that_cannot_run_here_is_a_usage_error_naming_the_fix(choice, says):
    with pytest.raises(UsageError) as err:
        accel.check(choice, CPU, "fp32", 0.0)
    assert err.value.one_line().startswith(says)
    accel.check("triton", CPU, "fp32", 0.0)
    accel.check("none", CPU, "fp32", 0.0)


@pytest.mark.parametrize("precision, dropout, modules, says", [
    ("fp32", 0.0, ("json",), "its kernels need bf16 (this run is fp32)"),
    ("bf16", 0.1, ("json",), "FlashAttention 4 has no dropout (dropout=0.1)"),
    ("bf16", 0.0, ("json", "gptforge_no_such_quack"), "gptforge_no_such_quack is not importable (ModuleNotFoundError: "),
    ("bf16", 0.0, ("json",), None),
])
def test_on_an_sm90_gpu_hopper_says_what_is_missing(sm90_here, monkeypatch, precision, dropout, modules, says):
    monkeypatch.setattr(hopper, "HOPPER_MODULES", modules)
    why = hopper.hopper_blocker(CPU, precision, dropout)
    assert why is None if says is None else why.startswith(says)


def test_hopper_refuses_a_dsl_outside_site_packages(sm90_here, monkeypatch, tmp_path):
    monkeypatch.setattr(hopper, "dsl_directory", lambda: str(tmp_path / "nvidia_cutlass_dsl"))
    assert f"installed outside a site-packages directory ({tmp_path / 'nvidia_cutlass_dsl'})" in \
        hopper.hopper_blocker(CPU, "bf16", 0.0)


def test_on_a_cpu_nothing_is_swapped_and_the_optimizer_is_foreach():
    model = GPT(TINY)
    before = [type(m) for m in model.modules()]
    plan = accel.accelerate(model, "triton", CPU, "fp32", cuda_graphs=True)
    assert [type(m) for m in model.modules()] == before
    assert (plan.compile_options, plan.cuda_graphs, plan.fused_optimizer, plan.notes) == ({}, False, False, [])


def test_on_an_sm90_gpu_without_hopper_the_log_suggests_it(sm90_here, monkeypatch):
    from gptforge.accel import xent_kernel

    monkeypatch.setattr(xent_kernel, "use_kernel", lambda: True)  # nothing runs on the device here
    notes = accel.accelerate(GPT(TINY), "triton", torch.device("cuda", 0), "bf16", cuda_graphs=True).notes
    assert [note.code for note in notes] == ["loss-triton-kernel", "accel-hopper-suggested"]


def test_the_trainer_stops_before_making_the_run_directory(tmp_path):
    proc = run_main("train", "--config", "gpt2-124m-hopper", "--device", "cpu", "--run-dir", str(tmp_path / "run"),
                    cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("gptforge: usage error: accel: hopper: its kernels need an sm_90 GPU")
    assert not (tmp_path / "run").exists()


def _train_task():
    spec = importlib.util.spec_from_file_location("train_gpt2_task", ROOT / "tasks" / "train_gpt2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_hopper_environments_train_gpt2_trains_the_named_config():
    from pixi_emulator import Workspace

    tasks = Workspace(ROOT).tasks
    assert tasks("hopper")["train-gpt2"].cmd == "python tasks/train_gpt2.py --config gpt2-124m-hopper"
    assert tasks("cuda-13-0")["train-gpt2"].cmd == "python tasks/train_gpt2.py"
    args = _train_task().arguments(["--config", "gpt2-124m-hopper", "train-iters=3"], gpu=True)
    assert args[:3] == ["train", "--config", "gpt2-124m-hopper"] and args[-1] == "train-iters=3"
    assert _train_task().arguments(["train-iters=3"], gpu=True)[:3] == ["train", "--config", "gpt2-124m"]
    assert _train_task().arguments(["--config", "gpt2-124m-hopper"], gpu=False) == ["train", "--config", "gpt2-tiny"]


# ---- the CuTe DSL's place ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("directory, outside", [
    ("/usr/lib/python3/dist-packages/nvidia_cutlass_dsl", None),
    ("/opt/env/lib/python3.12/site-packages/nvidia_cutlass_dsl", None),
    ("/tmp/site/nvidia_cutlass_dsl", "/tmp/site/nvidia_cutlass_dsl"),
    ("/tmp/my-site-packages-copy/nvidia_cutlass_dsl", "/tmp/my-site-packages-copy/nvidia_cutlass_dsl"),  # a name only
    (None, None),
])
def test_site_packages_means_a_directory_of_that_name(directory, outside):
    assert outside_site_packages(directory) == outside


def test_the_dsl_directory_is_found_without_importing_it(monkeypatch, tmp_path):
    (tmp_path / "nvidia_cutlass_dsl").mkdir()  # a namespace package, as the wheels install it
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nvidia_cutlass_dsl", raising=False)  # the DSL's .pth imports it at startup
    assert dsl_directory() == str(tmp_path / "nvidia_cutlass_dsl")
    probed = probe_hopper_kernels()
    assert probed["dsl_directory"] == str(tmp_path / "nvidia_cutlass_dsl") and probed["dsl_outside_site_packages"]


def test_the_doctor_warns_where_quack_would_fail():
    from gptforge.doctor.checks import check_hopper_kernels
    from gptforge.probe import probe_machine

    data = probe_machine().to_json()
    data["hopper_kernels"] = {"installed": True, "packages": {"quack-kernels": "0.6.5", "nvidia-cutlass-dsl": "4.7.1"},
                              "dsl_directory": "/tmp/site/nvidia_cutlass_dsl", "dsl_outside_site_packages": True}
    (finding,) = check_hopper_kernels(Machine.from_json(data))
    assert finding.code == "cute-dsl-outside-site-packages" and "/tmp/site/nvidia_cutlass_dsl" in finding.message
    data["hopper_kernels"]["dsl_outside_site_packages"] = False
    assert check_hopper_kernels(Machine.from_json(data)) == []


# ---- the attention ops on the CPU, FA4 and cuDNN stood in for by float32 math ------------------------------------

def test_the_attention_ops_have_shapes_for_the_compiler():
    qkv = torch.empty(2, 16, 3 * 4 * 8, device="meta", dtype=torch.bfloat16)
    out, lse = cudnn_fwd(qkv, 4, 0.35)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == ((2, 16, 4, 8), torch.bfloat16, (2, 4, 16), torch.float32)
    assert cudnn_flash4_attention(qkv, 4).shape == (2, 16, 32)
    assert flash4_bwd(torch.empty_like(out), qkv, out, lse, 4, 0.35).shape == qkv.shape


class MathFA4:
    """flash_attn.cute.interface's backward as the op calls it, in float32 with attention's textbook backward on
    the CPU: the ops' own work (views of qkv, the scale, the gradient slices, autograd, the compiler's fake
    shapes) is what is tested here; FA4's kernels themselves only on a GPU (below)."""

    @staticmethod
    def _flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale, causal, dq, dk, dv):
        scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * softmax_scale
        p = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        d_out = dout.float()
        d_p = torch.einsum("bqhd,bkhd->bhqk", d_out, v.float())
        d_s = p * (d_p - (d_out * out.float()).sum(-1).transpose(1, 2).unsqueeze(-1))
        dq.copy_(torch.einsum("bhqk,bkhd->bqhd", d_s, k.float()) * softmax_scale)  # FA4 writes into what it is given
        dk.copy_(torch.einsum("bhqk,bqhd->bkhd", d_s, q.float()) * softmax_scale)
        dv.copy_(torch.einsum("bhqk,bqhd->bkhd", p, d_out))
        return dq, dk, dv


def math_cudnn(q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask, scale):
    """aten._scaled_dot_product_cudnn_attention as the op calls it, in float32 on the CPU: (batch, heads,
    seq, head_dim) strided views in, the output in q's memory layout and a (batch, heads, seq, 1) natural-log
    log-sum-exp out, as cuDNN gives them."""
    assert attn_bias is None and compute_log_sumexp and is_causal and not dropout_p and q.stride(-1) == 1
    scores = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) * scale
    scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v.float()).to(q.dtype)
    out = out.transpose(1, 2).contiguous().transpose(1, 2)  # q's layout: (batch, seq, heads, head_dim) in memory
    return out, torch.logsumexp(scores, dim=-1, keepdim=True), None, None, q.shape[2], k.shape[2], None, None, None


@pytest.fixture
def math_attention(monkeypatch):
    monkeypatch.setattr(attention, "_fa4", MathFA4)
    monkeypatch.setattr(attention, "_cudnn", lambda: math_cudnn)


@pytest.mark.parametrize("compiled", [False, True])
def test_the_ops_carry_qkv_and_its_gradient_whole(math_attention, compiled):
    torch.manual_seed(0)
    qkv = torch.randn(2, 16, 3 * 4 * 8, requires_grad=True)
    attend = torch.compile(cudnn_flash4_attention, fullgraph=True) if compiled else cudnn_flash4_attention
    out = attend(qkv, 4)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    got = qkv.grad.clone()
    qkv.grad = None
    q, k, v = (t.view(2, 16, 4, 8).transpose(1, 2) for t in qkv.split(32, dim=2))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 16, 32)
    ref.backward(grad_out)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(got, qkv.grad)


def test_gpt_with_the_swapped_attention_trains_as_the_plain_one(math_attention):
    def swap(model):
        for block in model.blocks:
            block.attn = FlashAttention(block.attn)

    assert_trains_as_the_default(swap, rtol=1e-4, atol=1e-5)


def test_without_gradients_the_epilogue_loss_spans_the_padded_vocabulary_as_in_training():
    from gptforge.accel.loss import EpilogueLoss

    torch.manual_seed(0)
    h, w = torch.randn(64, 16), torch.randn(256, 16)
    t = torch.randint(0, 200, (64,))
    with torch.no_grad():
        got = EpilogueLoss(32)(h, w, t)
        real_vocabulary = linear_cross_entropy(h, w, t, 200, 32)
    torch.testing.assert_close(got, F.cross_entropy(h @ w.t(), t))
    assert got > real_vocabulary  # the padding's 56 columns take their share of the softmax


# ---- on an sm_90 GPU with the hopper environment's packages -------------------------------------------------------

on_hopper = pytest.mark.skipif(not torch.cuda.is_available() or
                               hopper.hopper_blocker(torch.device("cuda"), "bf16", 0.0) is not None,
                               reason="needs an sm_90 GPU with flash-attn-4, quack-kernels and the CuTe DSL")


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("compiled", [False, True])
def test_on_gpu_the_attention_matches_sdpa_in_float32(compiled):
    torch.manual_seed(0)
    qkv = torch.randn(2, 256, 3 * 4 * 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    attend = torch.compile(cudnn_flash4_attention, fullgraph=True) if compiled else cudnn_flash4_attention
    out = attend(qkv, 4)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    got = qkv.grad.clone()  # dq, dk, dv written by FA4 into the slices of one tensor
    qkv.grad = None
    q, k, v = (t.float().view(2, 256, 4, 64).transpose(1, 2) for t in qkv.split(4 * 64, dim=2))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 256, 4 * 64)
    ref.backward(grad_out.float())
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got.float(), qkv.grad.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@on_hopper
def test_on_gpu_the_epilogue_mlp_matches_the_torch_mlp():
    from gptforge.accel.mlp import EpilogueMLP
    from gptforge.model.config import ModelConfig

    cfg = ModelConfig(num_layers=1, hidden_size=256, num_attention_heads=4, max_position_embeddings=128, vocab_size=512)
    torch.manual_seed(0)
    reference = GPT(cfg).cuda()
    epilogue = GPT(cfg).cuda()
    epilogue.load_state_dict(reference.state_dict())
    epilogue.blocks[0].mlp = EpilogueMLP(epilogue.blocks[0].mlp)
    x = torch.randint(0, 512, (4, 128), device="cuda")
    losses, grads = [], []
    for model in (reference, epilogue):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, x)
        loss.backward()
        losses.append(loss.item())
        mlp = model.blocks[0].mlp
        grads.append([p.grad for p in (mlp.fc.weight, mlp.fc.bias, mlp.proj.weight, mlp.proj.bias, model.wte.weight)])
    assert losses[1] == pytest.approx(losses[0], abs=1e-2)
    for got, want in zip(grads[1], grads[0]):  # the bias gradients too: fc's from a GEMM's epilogue
        assert got.dtype == want.dtype == torch.float32
        assert (got - want).abs().max() <= 2e-2 * want.abs().max()


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
@on_hopper
@pytest.mark.parametrize("confident", [False, True])
def test_on_gpu_the_epilogue_loss_and_gradients_match_float64_over_the_padded_vocabulary(confident):
    from gptforge.accel.loss import EpilogueLoss

    torch.manual_seed(0)
    tokens, hidden, padded = 4096, 768, 50304
    h = (torch.randn(tokens, hidden, device="cuda")).requires_grad_()
    w = torch.randn(padded, hidden, device="cuda") * (0.2 if confident else 0.02)
    t = torch.randint(0, 50257, (tokens,), device="cuda")
    if confident:  # the target's logit well above the rest: softmax[target] - 1 is a small difference
        w[t] += h.detach() * 0.05
    w.requires_grad_()
    ref_loss, ref_h, ref_w = float64_reference(h, w, t, padded)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = EpilogueLoss(2048)(h, w, t)
    loss.backward()
    assert w.grad.dtype == torch.float32
    # bf16's rounding (2^-9 = 2e-3 per entry) is the scale: E and the rescaled h are bf16
    errors = (abs(loss.item() - ref_loss), relative_error(h.grad, ref_h), relative_error(w.grad, ref_w))
    assert errors[0] < 1e-3 and errors[1] < 5e-3 and errors[2] < 5e-3, errors


@pytest.mark.gpu
@on_hopper
def test_on_gpu_training_with_hopper_and_accumulation_lands_where_triton_does(tmp_path):
    run = ["--config", "gpt2-tiny", "--device", "cuda", "--json", "precision=bf16", "compile=true", "train-iters=60",
           "micro-batch-size=8", "save-interval=60", "eval-interval=60", f"data-cache-dir={tmp_path / 'data'}"]
    results = {}
    for choice in ("triton", "hopper"):
        proc = run_cli("train", "--run-dir", str(tmp_path / choice), *run, f"accel={choice}", cwd=tmp_path, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[choice] = json.loads(proc.stdout)
    assert "accel-hopper" in {note["code"] for note in results["hopper"]["notes"]}
    assert results["hopper"]["final_val_loss"] < results["hopper"]["first_val_loss"] - 0.5
    assert results["hopper"]["final_val_loss"] == pytest.approx(results["triton"]["final_val_loss"], abs=0.1)
