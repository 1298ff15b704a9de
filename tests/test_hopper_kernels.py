"""attention-backend=flash4 (and cudnn-flash4) and gelu-epilogue: on only where they can run, a note saying why not elsewhere;
on a Hopper/Blackwell GPU with flash-attn-4 and quack-kernels, the same numbers as the torch paths."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gptforge.model import kernels
from gptforge.model.flash4 import cudnn_fwd, flash4_attention, flash4_bwd, flash4_fwd
from gptforge.model.layers import LayerBackend
from gptforge.probe.machine import Machine
from gptforge.core.installed import dsl_directory, outside_site_packages
from gptforge.probe.packages import probe_hopper_kernels
from gptforge.train.config import load_config, validate
from gpt_pairs import assert_trains_as_the_default

CPU = torch.device("cpu")


@pytest.fixture
def hopper_here(monkeypatch):
    """The GPU checks pass on this machine: what is tested is every check after them."""
    monkeypatch.setattr(kernels, "hopper_or_blackwell", lambda device: True)


@pytest.mark.parametrize("name", ["flash4", "cudnn-flash4"])
def test_flash4_is_a_valid_attention_backend(name):
    cfg, _ = load_config("gpt2-tiny", [f"attention-backend={name}"])
    validate(cfg)


def test_flash4_asked_for_on_a_cpu_falls_back_to_sdpa_with_the_reason():
    backend = LayerBackend(attention="flash4")
    note = kernels.use_flash4(backend, CPU, dropout=0.0)
    assert backend.attention == "auto"
    assert note == "FlashAttention 4 asked for but needs an sm_90 or sm_100 GPU: SDPA's own choice of kernel"


@pytest.mark.parametrize("dropout, module, says", [
    (0.1, "json", "has no dropout (dropout=0.1)"),
    (0.0, "gptforge_no_such_module.interface", "is not importable (ModuleNotFoundError: No module named "
                                               "'gptforge_no_such_module'; pip install flash-attn-4)"),
])
def test_flash4_on_a_hopper_without_what_it_needs_says_which(hopper_here, monkeypatch, dropout, module, says):
    monkeypatch.setattr(kernels, "FA4_MODULE", module)
    backend = LayerBackend(attention="flash4")
    assert kernels.use_flash4(backend, CPU, dropout) == f"FlashAttention 4 asked for but {says}: SDPA's own choice of kernel"
    assert backend.attention == "auto"


def test_cudnn_flash4_asked_for_on_a_cpu_falls_back_to_sdpa_with_the_reason():
    backend = LayerBackend(attention="cudnn-flash4")
    note = kernels.use_flash4(backend, CPU, dropout=0.0)
    assert backend.attention == "auto"
    assert note == ("cuDNN forward + FlashAttention 4 backward asked for but needs an sm_90 or sm_100 GPU: "
                    "SDPA's own choice of kernel")


def test_cudnn_flash4_without_cudnn_says_so(hopper_here, monkeypatch):
    monkeypatch.setattr(kernels, "FA4_MODULE", "json")
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: False)
    backend = LayerBackend(attention="cudnn-flash4")
    assert "but its forward needs torch built with cuDNN" in kernels.use_flash4(backend, CPU, 0.0)
    assert backend.attention == "auto"


@pytest.mark.parametrize("name, says", [("flash4", "attention: FlashAttention 4 (flash_attn.cute)"),
                                        ("cudnn-flash4", "attention: cuDNN's forward")])
def test_flash4_with_everything_in_place_stays_on(hopper_here, monkeypatch, name, says):
    monkeypatch.setattr(kernels, "FA4_MODULE", "json")  # any importable module stands for flash_attn.cute
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    backend = LayerBackend(attention=name)
    assert kernels.use_flash4(backend, CPU, 0.0).startswith(says)
    assert backend.attention == name


def test_other_attention_backends_get_no_flash4_note():
    backend = LayerBackend(attention="cudnn")
    assert kernels.use_flash4(backend, CPU, 0.0) is None and backend.attention == "cudnn"


def test_gelu_epilogue_falls_back_with_the_reason():
    backend = LayerBackend()
    assert kernels.use_gelu_epilogue(backend, CPU, asked=False) is None
    assert kernels.use_gelu_epilogue(backend, CPU, asked=True) == \
        "GELU epilogue asked for but needs an sm_90 or sm_100 GPU: torch MLP"
    assert backend.mlp == "torch"


@pytest.mark.parametrize("backend, float8, says", [
    (LayerBackend(linear="te"), "off", "TransformerEngine layers are on: TE's MLP"),
    (LayerBackend(), "tensorwise", "float8=tensorwise is on (quack's GEMMs here are bf16): torchao's MLP"),
])
def test_gelu_epilogue_yields_to_the_other_linear_layers(hopper_here, monkeypatch, backend, float8, says):
    monkeypatch.setattr(kernels, "QUACK_MODULE", "json")
    assert kernels.use_gelu_epilogue(backend, CPU, True, float8) == f"GELU epilogue asked for but {says}"
    assert backend.mlp == "torch"


def test_gelu_epilogue_on_a_hopper_without_quack_says_how_to_get_it(hopper_here, monkeypatch):
    monkeypatch.setattr(kernels, "QUACK_MODULE", "gptforge_no_such_quack")
    backend = LayerBackend()
    note = kernels.use_gelu_epilogue(backend, CPU, asked=True)
    assert note.startswith("GELU epilogue asked for but quack is not importable (ModuleNotFoundError: ")
    assert note.endswith("; pip install quack-kernels): torch MLP") and backend.mlp == "torch"


def test_gelu_epilogue_refuses_a_dsl_outside_site_packages(hopper_here, monkeypatch, tmp_path):
    monkeypatch.setattr(kernels, "QUACK_MODULE", "json")
    monkeypatch.setattr(kernels, "dsl_directory", lambda: str(tmp_path / "nvidia_cutlass_dsl"))
    backend = LayerBackend()
    note = kernels.use_gelu_epilogue(backend, CPU, asked=True)
    assert f"installed outside a site-packages directory ({tmp_path / 'nvidia_cutlass_dsl'})" in note
    assert backend.mlp == "torch"


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


@pytest.mark.parametrize("forward", [flash4_fwd, cudnn_fwd])
def test_flash4_ops_have_shapes_for_the_compiler(forward):
    qkv = torch.empty(2, 16, 3 * 4 * 8, device="meta", dtype=torch.bfloat16)
    out, lse = forward(qkv, 4, 0.35)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == ((2, 16, 4, 8), torch.bfloat16, (2, 4, 16), torch.float32)
    assert flash4_attention(qkv, 4).shape == (2, 16, 32)
    assert flash4_bwd(torch.empty_like(out), qkv, out, lse, 4, 0.35).shape == qkv.shape


class MathFA4:
    """flash_attn.cute.interface's two entry points as the ops call them, computed in float32 with
    attention's textbook forward and backward on the CPU: the ops' own work (views of qkv, the scale, the
    gradient slices, autograd, the compiler's fake shapes) is what is tested here; FA4's kernels
    themselves only on a GPU (below)."""

    @staticmethod
    def _probs(q, k, scale):  # (batch, heads, q, k) causal softmax of (batch, seq, heads, head_dim) inputs
        scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
        return scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))

    def _flash_attn_fwd(self, q, k, v, softmax_scale, causal, return_lse):
        assert causal and return_lse and q.stride(-1) == 1 and not q.is_contiguous()  # strided views, as FA4 takes
        scores = self._probs(q, k, softmax_scale)
        out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v.float()).to(q.dtype).contiguous()  # as FA4 allocates it
        return out, torch.logsumexp(scores, dim=-1), None, None, None

    def _flash_attn_bwd(self, q, k, v, out, dout, lse, softmax_scale, causal, dq, dk, dv):
        p = self._probs(q, k, softmax_scale).softmax(-1)
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


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("forward", ["flash4", "cudnn-flash4"])
def test_flash4_ops_carry_qkv_and_its_gradient_whole(monkeypatch, compiled, forward):
    from gptforge.model import flash4

    monkeypatch.setattr(flash4, "_fa4", MathFA4)
    monkeypatch.setattr(flash4, "_cudnn", lambda: math_cudnn)
    torch.manual_seed(0)
    qkv = torch.randn(2, 16, 3 * 4 * 8, requires_grad=True)
    attend = torch.compile(flash4_attention, fullgraph=True) if compiled else flash4_attention
    out = attend(qkv, 4, forward)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    got = qkv.grad.clone()
    qkv.grad = None
    q, k, v = (t.view(2, 16, 4, 8).transpose(1, 2) for t in qkv.split(32, dim=2))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 16, 32)
    ref.backward(grad_out)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(got, qkv.grad)


@pytest.mark.parametrize("name", ["flash4", "cudnn-flash4"])
def test_gpt_with_flash4_computes_what_sdpa_does(monkeypatch, name):
    from gptforge.model import flash4

    monkeypatch.setattr(flash4, "_fa4", MathFA4)
    monkeypatch.setattr(flash4, "_cudnn", lambda: math_cudnn)
    assert_trains_as_the_default(LayerBackend(attention=name), rtol=1e-4, atol=1e-5)


def test_the_trainer_logs_both_fallbacks_on_a_cpu(tmp_path, train_data_cache):
    cmd = [sys.executable, "-m", "gptforge", "train", "--config", "gpt2-tiny", "--device", "cpu", "--json",
           "--run-dir", str(tmp_path / "run"), "train-iters=2", "lr-warmup-iters=1", "attention-backend=flash4",
           "gelu-epilogue=true", f"data-cache-dir={train_data_cache}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    notes = json.loads(proc.stdout)["notes"]
    assert "FlashAttention 4 asked for but needs an sm_90 or sm_100 GPU: SDPA's own choice of kernel" in notes
    assert "GELU epilogue asked for but needs an sm_90 or sm_100 GPU: torch MLP" in notes


# ---- on a Hopper or Blackwell GPU with the packages ----------------------------------------------------------

hopper = pytest.mark.skipif(not torch.cuda.is_available() or not kernels.hopper_or_blackwell(torch.device("cuda")),
                            reason="needs an sm_90 or sm_100 NVIDIA GPU")


def needs(module: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"needs {module}")


@pytest.mark.gpu
@hopper
@needs("flash_attn")
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("forward", ["flash4", "cudnn-flash4"])
def test_on_gpu_flash4_attention_matches_sdpa_in_float32(compiled, forward):
    torch.manual_seed(0)
    qkv = torch.randn(2, 256, 3 * 4 * 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    attend = torch.compile(flash4_attention, fullgraph=True) if compiled else flash4_attention
    out = attend(qkv, 4, forward)
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
@hopper
@needs("flash_attn")
def test_on_gpu_cudnn_gives_fa4_its_output_layout_and_log_sum_exp_without_copies():
    torch.manual_seed(0)
    qkv = torch.randn(4, 1024, 3 * 12 * 64, device="cuda", dtype=torch.bfloat16)
    q, k, v = (t.view(4, 1024, 12, 64).transpose(1, 2) for t in qkv.split(12 * 64, dim=2))
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False, scale=0.125)[:2]
    assert out.transpose(1, 2).is_contiguous() and lse.shape == (4, 12, 1024, 1) and lse.is_contiguous()
    fa4_out, fa4_lse = flash4_fwd(qkv, 12, 0.125)
    torch.testing.assert_close(lse.view(4, 12, 1024), fa4_lse, atol=1e-3, rtol=0)  # the same natural-log convention
    torch.testing.assert_close(out.transpose(1, 2), fa4_out, atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@hopper
@needs("quack")
@pytest.mark.parametrize("bias_gemm", [False, True])
def test_on_gpu_the_epilogue_mlp_matches_the_torch_mlp(bias_gemm):
    from gptforge.model import GPT, ModelConfig

    cfg = ModelConfig(num_layers=1, hidden_size=256, num_attention_heads=4, max_position_embeddings=128, vocab_size=512)
    torch.manual_seed(0)
    reference = GPT(cfg).cuda()
    epilogue = GPT(cfg, LayerBackend(mlp="quack", mlp_bias_gemm=bias_gemm)).cuda()
    epilogue.load_state_dict(reference.state_dict())
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
    for got, want in zip(grads[1], grads[0]):  # the bias gradients too: fc's from a GEMM's epilogue or the wgrad GEMM
        assert got.dtype == want.dtype == torch.float32
        assert (got - want).abs().max() <= 2e-2 * want.abs().max()


@pytest.mark.gpu
@hopper
@needs("flash_attn")
@needs("quack")
def test_on_gpu_training_with_both_lands_where_the_default_does(tmp_path):
    run = ["--config", "gpt2-tiny", "--device", "cuda", "--json", "precision=bf16", "compile=true", "train-iters=60",
           "save-interval=60", "eval-interval=60", f"data-cache-dir={tmp_path / 'data'}"]
    results = {}
    for name, keys in (("default", []), ("hopper", ["attention-backend=flash4", "gelu-epilogue=true"])):
        proc = subprocess.run([sys.executable, "-m", "gptforge", "train", *run, "--run-dir", str(tmp_path / name), *keys],
                              capture_output=True, text=True, timeout=900, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        results[name] = json.loads(proc.stdout)
    assert not any("asked for but" in n for n in results["hopper"]["notes"])
    assert results["hopper"]["final_val_loss"] < results["hopper"]["first_val_loss"] - 0.5
    assert results["hopper"]["final_val_loss"] == pytest.approx(results["default"]["final_val_loss"], abs=0.1)


@pytest.mark.parametrize("script", ["attention_kernels", "mlp_epilogue"])
def test_the_benchmarks_say_what_they_need_where_there_is_no_gpu(script):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the benchmark would run")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "bench" / f"{script}.py")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root / "src")}, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"{script}: needs a CUDA GPU (none visible)"


def test_the_mlp_benchmark_names_the_variants_it_knows():
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "bench" / "mlp_epilogue.py"), "--mlps", "gptforge,fused"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root / "src")}, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("mlp_epilogue.py: --mlps: unknown fused "
                                   "(known: torch-compiled, quack-epilogue, gptforge, gptforge-bias-gemm)")


def test_gelu_epilogue_with_everything_in_place_turns_quack_on(hopper_here, monkeypatch):
    monkeypatch.setattr(kernels, "QUACK_MODULE", "json")
    monkeypatch.setattr(kernels, "dsl_directory", lambda: "/env/lib/python3.12/site-packages/nvidia_cutlass_dsl")
    backend = LayerBackend()
    assert kernels.use_gelu_epilogue(backend, CPU, True).startswith("MLP: quack GEMMs, bias + GELU")
    assert backend.mlp == "quack"


# --- the hopper environment's keys (hopper-kernels; tests/test_hopper_keys.py) ---------------------------------------------

def test_the_hopper_keys_are_valid_on_the_gpt2_config():
    cfg, _ = load_config("gpt2-124m", list(kernels.HOPPER_KEYS))
    validate(cfg)
    assert (cfg.attention_backend, cfg.gelu_epilogue, cfg.loss_epilogue, cfg.qkv_bias_gemm, cfg.compile_mode) == \
        ("cudnn-flash4", True, True, True, "reduce-overhead")


def test_the_hopper_keys_need_an_sm90_gpu():
    assert kernels.hopper_keys_blocker(CPU) == "needs an sm_90 GPU"


def test_the_hopper_keys_are_on_where_every_kernel_runs(sm90_here):
    assert kernels.hopper_keys_blocker(CPU) is None


@pytest.mark.parametrize("attr, value, says", [
    ("FA4_MODULE", "gptforge_no_fa4", "flash-attn-4 is not importable (ModuleNotFoundError: No module named 'gptforge_no_fa4')"),
    ("QUACK_MODULE", "gptforge_no_quack", "quack is not importable (ModuleNotFoundError: No module named 'gptforge_no_quack'; "
                                          "pip install quack-kernels)"),
    ("QUACK_LCE_MODULE", "gptforge_no_lce", "quack is not importable (ModuleNotFoundError: No module named 'gptforge_no_lce'; "
                                            "pip install quack-kernels)"),
])
def test_the_hopper_keys_name_the_missing_package(sm90_here, monkeypatch, attr, value, says):
    monkeypatch.setattr(kernels, attr, value)
    assert kernels.hopper_keys_blocker(CPU) == says


def test_the_hopper_keys_refuse_a_dsl_outside_site_packages(sm90_here, monkeypatch, tmp_path):
    monkeypatch.setattr(kernels, "dsl_directory", lambda: str(tmp_path / "nvidia_cutlass_dsl"))
    assert "installed outside a site-packages directory" in kernels.hopper_keys_blocker(CPU)


def test_the_hopper_keys_without_cudnn_say_so(sm90_here, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: False)
    assert kernels.hopper_keys_blocker(CPU) == "cuDNN's attention needs torch built with cuDNN"
