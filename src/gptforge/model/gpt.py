"""GPT-2: pre-LN blocks, learned positions, GELU MLP, tied input/output embeddings, SDPA attention.

Training takes its loss from the fused output layer + cross-entropy (model/loss.py), which never forms the
whole logits tensor. Faster kernels replace modules of this model after it is built (gptforge.accel); the
model itself never asks which ones are in place.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gptforge.model.config import ModelConfig
from gptforge.model.loss import FusedLoss

INIT_STD = 0.02


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.proj.residual_out = True
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        qkv = self.qkv(x)
        q, k, v = (t.view(batch, seq, self.heads, width // self.heads).transpose(1, 2) for t in qkv.split(width, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(batch, seq, width)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size)
        self.proj = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size)
        self.proj.residual_out = True
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden_size)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden_size)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def bf16_autocast(device_type: str) -> bool:
    return torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.wpe = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied embeddings
        self.loss = FusedLoss(cfg.vocab_size)
        if not self.wte.weight.is_meta:  # a model on the meta device only counts (train/estimate.py): no values to draw
            self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # GPT-2 init: N(0, 0.02) everywhere, residual output projections scaled by 1/sqrt(2 * layers).
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
        elif isinstance(module, nn.Linear):
            std = INIT_STD / math.sqrt(2 * self.cfg.num_layers) if getattr(module, "residual_out", False) else INIT_STD
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """(logits, None) without targets; (None, mean loss) with them: training never forms the whole logits."""
        seq = idx.shape[1]
        if seq > self.cfg.max_position_embeddings:
            raise ValueError(f"sequence of {seq} tokens exceeds the position table ({self.cfg.max_position_embeddings})")
        pos = torch.arange(seq, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        if bf16_autocast(x.device.type):
            # Megatron's default (no fp32 residual connection): the adds, LayerNorms and their backward
            # move half the bytes; weights, LayerNorm statistics and gradients of weights stay float32.
            x = x.to(torch.bfloat16)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if targets is not None:
            return None, self.loss(x.reshape(-1, x.size(-1)), self.lm_head.weight, targets.reshape(-1))
        # The padded rows make the matmul tensor-core friendly; they stand for no token, so their logits
        # are cut before sampling.
        return self.lm_head(x)[..., : self.cfg.vocab_size], None

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
