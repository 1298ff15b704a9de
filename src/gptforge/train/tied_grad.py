"""A torch.compile pass for tied embeddings (``compile-tied-scatter = true``): the token embedding's gradient is
scattered straight into the output layer's gradient of the same weight.

Autograd sums a tied weight's two gradients. The embedding's is a scatter-add of the tokens' gradients into a
zero-filled table, so the compiled backward fills a table, scatters into it and adds it to the output layer's
gradient: for GPT-2 124M a 154 MB fill and a pass reading 308 MB and writing 154 MB a step, where scattering
into the output layer's gradient (or a copy of it) is all the sum needs. The pass rewrites, in inductor's
post-grad graph, ``add(G, scatter_add(zeros, idx, v))`` into ``scatter_add(G, idx, v)``. Only the order of the
float32 additions changes (the tokens' rows join G one by one instead of as their sum, in the atomics'
order either way).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

aten = torch.ops.aten
# the embedding backward's decomposition in recent torch; older ones scatter with _unsafe_index_put
MASKED_SCATTER = getattr(aten, "_unsafe_masked_index_put_accumulate", None)


def accumulating_scatter(node: torch.fx.Node) -> bool:
    """NODE adds values into rows of a table: the ops the embedding's backward decomposes into."""
    if MASKED_SCATTER is not None and node.target is MASKED_SCATTER.default:
        return True
    if node.target not in (aten._unsafe_index_put.default, aten.index_put.default):
        return False
    return bool(node.kwargs.get("accumulate", node.args[3] if len(node.args) > 3 else False))


def zero_table(node) -> bool:
    """NODE is a zero-filled tensor that one node reads."""
    return (isinstance(node, torch.fx.Node) and node.target is aten.full.default and node.args[1] == 0
            and len(node.users) == 1)


def same_tensor_type(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    return isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.shape == vb.shape \
        and va.dtype == vb.dtype and va.device == vb.device


def scatter_into_zeros(node) -> bool:
    """NODE is an accumulating scatter into a zero-filled table that only an add reads."""
    return (isinstance(node, torch.fx.Node) and accumulating_scatter(node)
            and zero_table(node.args[0]) and len(node.users) == 1)


def rewrite(graph: torch.fx.Graph) -> int:
    """Fold every add(G, scatter_add(zeros, idx, v)) in GRAPH into scatter_add(G, idx, v); how many were folded."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    folded = 0
    for add in list(graph.nodes):
        if add.target is not aten.add.Tensor or add.kwargs.get("alpha", 1) != 1 or len(add.args) != 2:
            continue
        for scatter, other in ((add.args[1], add.args[0]), (add.args[0], add.args[1])):
            if (scatter_into_zeros(scatter) and isinstance(other, torch.fx.Node) and order[other] < order[scatter]
                    and same_tensor_type(other, scatter)):
                table = scatter.args[0]
                scatter.replace_input_with(table, other)
                scatter.meta["val"] = add.meta.get("val", scatter.meta.get("val"))
                add.replace_all_uses_with(scatter)
                graph.erase_node(add)
                graph.erase_node(table)
                folded += 1
                break
    return folded


class TiedScatter(CustomGraphPass):
    """The rewrite as inductor's post-grad custom pass; ``folded`` counts the sites rewritten by this process's
    compilations (a graph inductor takes from its cache is not compiled again, so it adds none)."""

    def __init__(self) -> None:
        self.folded = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.folded += rewrite(graph)

    def uuid(self) -> bytes:
        return hashlib.sha256(Path(__file__).read_bytes()).digest()


TIED_SCATTER = TiedScatter()
