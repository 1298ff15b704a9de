"""GPT-2: pre-LN blocks, learned positions, GELU MLP, tied input/output embeddings, SDPA attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gptforge.model.bias_gemm import linear_bias_from_gemm
from gptforge.model.config import ModelConfig
from gptforge.model.flash4 import FORWARDS as FLASH4_FORWARDS, flash4_attention
from gptforge.model.layers import LayerBackend, attention_kernel, make_layer_norm, make_linear
from gptforge.model.loss import linear_cross_entropy

INIT_STD = 0.02


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: LayerBackend):
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.dropout = cfg.dropout
        self.kernel = backend.attention
        self.qkv_bias_gemm = backend.qkv_bias_gemm
        self.qkv = make_linear(backend, cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = make_linear(backend, cfg.hidden_size, cfg.hidden_size)
        self.proj.residual_out = True
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        if self.qkv_bias_gemm:
            qkv = linear_bias_from_gemm(*(autocast_dtype(t) for t in (x, self.qkv.weight, self.qkv.bias)))
        else:
            qkv = self.qkv(x)
        if self.kernel in FLASH4_FORWARDS:  # no transposes, no concatenation of the gradients
            return self.resid_dropout(self.proj(flash4_attention(qkv, self.heads, self.kernel)))
        q, k, v = (t.view(batch, seq, self.heads, width // self.heads).transpose(1, 2) for t in qkv.split(width, dim=2))
        with attention_kernel(self.kernel):
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
            )
        y = y.transpose(1, 2).contiguous().view(batch, seq, width)
        return self.resid_dropout(self.proj(y))


def autocast_dtype(t: torch.Tensor) -> torch.Tensor:
    """T in the dtype autocast gives a Linear's operands (the quack MLP takes them cast)."""
    return t.to(torch.get_autocast_dtype("cuda")) if torch.is_autocast_enabled("cuda") else t


def bf16_autocast(device_type: str) -> bool:
    return torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: LayerBackend):
        super().__init__()
        self.fc = make_linear(backend, cfg.hidden_size, 4 * cfg.hidden_size)
        self.proj = make_linear(backend, 4 * cfg.hidden_size, cfg.hidden_size)
        self.proj.residual_out = True
        self.dropout = nn.Dropout(cfg.dropout)
        self.kernel = backend.mlp
        self.bias_gemm = backend.mlp_bias_gemm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "quack":
            from gptforge.model.mlp_epilogue import epilogue_mlp

            operands = (autocast_dtype(t) for t in (x, self.fc.weight, self.fc.bias, self.proj.weight, self.proj.bias))
            return self.dropout(epilogue_mlp(*operands, bias_from_gemm=self.bias_gemm))
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: LayerBackend):
        super().__init__()
        self.ln_1 = make_layer_norm(backend, cfg.hidden_size)
        self.attn = CausalSelfAttention(cfg, backend)
        self.ln_2 = make_layer_norm(backend, cfg.hidden_size)
        self.mlp = MLP(cfg, backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: LayerBackend | None = None):
        super().__init__()
        backend = backend or LayerBackend()
        self.cfg = cfg
        self.loss_chunk = backend.loss_chunk
        self.loss_fp8 = backend.loss_fp8
        self.loss_fp8_logits = backend.loss_fp8_logits
        self.loss_epilogue = backend.loss_epilogue
        self.bf16_residual = backend.bf16_residual
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.wpe = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, backend) for _ in range(cfg.num_layers))
        self.ln_f = make_layer_norm(backend, cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied embeddings
        if not self.wte.weight.is_meta:  # a model on the meta device only counts (train/estimate.py): no values to draw
            self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # GPT-2 init: N(0, 0.02) everywhere, residual output projections scaled by 1/sqrt(2 * layers).
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
        elif hasattr(module, "weight") and module.weight is not None and module.weight.dim() == 2:
            std = INIT_STD / math.sqrt(2 * self.cfg.num_layers) if getattr(module, "residual_out", False) else INIT_STD
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        seq = idx.shape[1]
        if seq > self.cfg.max_position_embeddings:
            raise ValueError(f"sequence of {seq} tokens exceeds the position table ({self.cfg.max_position_embeddings})")
        pos = torch.arange(seq, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        if self.bf16_residual and bf16_autocast(x.device.type):
            # Megatron's default (no fp32 residual connection): the adds, LayerNorms and their backward
            # move half the bytes; weights, LayerNorm statistics and gradients of weights stay float32.
            x = x.to(torch.bfloat16)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if targets is not None and self.loss_chunk:
            # logits are never formed whole: the caller gets the loss only
            return None, linear_cross_entropy(x.reshape(-1, x.size(-1)), self.lm_head.weight, targets.reshape(-1),
                                              self.cfg.vocab_size, self.loss_chunk, self.loss_fp8, self.loss_fp8_logits,
                                              self.loss_epilogue)
        # The padded rows make the matmul tensor-core friendly; they stand for no token, so their logits
        # are cut before the loss's softmax and before sampling.
        logits = self.lm_head(x)[..., : self.cfg.vocab_size]
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def num_params(self, include_positions: bool = False) -> int:
        """Parameter count (tied embedding once); MFU's N excludes the position table (PaLM / nanoGPT)."""
        total = sum(p.numel() for p in self.parameters())
        return total if include_positions else total - self.wpe.weight.numel()

    def flops_per_token(self, seq_length: int) -> int:
        """Training FLOPs per token, PaLM appendix B: 6N + 12·L·H·Q·T (no causal-mask discount)."""
        cfg = self.cfg
        return 6 * self.num_params() + 12 * cfg.num_layers * cfg.num_attention_heads * cfg.head_dim * seq_length

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        for _ in range(max_new_tokens):
            window = idx[:, -self.cfg.max_position_embeddings:]
            logits, _ = self(window)
            logits = logits[:, -1].float()
            if temperature <= 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
