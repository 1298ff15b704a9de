"""compile-tied-scatter: the tied embedding's two gradients summed by one scatter (train/tied_grad.py)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gptforge.train.tied_grad import TiedScatter


class Tied(nn.Module):
    """An embedding whose table is also the output layer's weight, as GPT-2's."""

    def __init__(self, vocab: int = 1000, width: int = 64):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.ln = nn.LayerNorm(width)

    def forward(self, idx, targets):
        x = self.ln(self.wte(idx))
        logits = x @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def gradients(model: nn.Module, options: dict, idx, targets) -> dict[str, torch.Tensor]:
    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.compile(model, options=options)(idx, targets)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.fixture
def batch():
    torch.manual_seed(0)
    return torch.randint(0, 1000, (4, 32)), torch.randint(0, 1000, (4, 32))


def test_the_scatter_into_the_output_layers_gradient_gives_the_same_gradients(batch):
    torch.manual_seed(1)
    model = Tied()
    folding = TiedScatter()
    plain = gradients(model, {"fx_graph_cache": False}, *batch)
    folded = gradients(model, {"fx_graph_cache": False, "post_grad_custom_post_pass": folding}, *batch)
    assert folding.folded == 1  # the embedding's table no longer exists in the backward graph
    for name, grad in plain.items():
        torch.testing.assert_close(folded[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_an_untied_model_is_left_alone(batch):
    class Untied(Tied):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(64, 1000, bias=False)

        def forward(self, idx, targets):
            logits = self.head(self.ln(self.wte(idx)))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    folding = TiedScatter()
    gradients(Untied(), {"fx_graph_cache": False, "post_grad_custom_post_pass": folding}, *batch)
    assert folding.folded == 0


def test_the_pass_names_its_source_for_inductors_cache():
    assert TiedScatter().uuid() == TiedScatter().uuid() and len(TiedScatter().uuid()) == 32
