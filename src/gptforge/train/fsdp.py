"""FSDP2: the model's parameters, gradients and optimizer state sharded over the data-parallel ranks
(``torch.distributed.fsdp.fully_shard``), each transformer block compiled on its own (torchtitan's recipe),
checkpoints written by every rank with torch.distributed.checkpoint (DCP).

Every block is its own FSDP unit, so its all-gather overlaps the block before it; the root unit holds the
embeddings (the token table is also the tied output matrix), the final LayerNorm and the loss. Under bf16
the all-gathered weights are bf16 and gradients are reduce-scattered in float32; the shards, the optimizer
state and the checkpoint stay float32.

A checkpoint holds ``fsdp/`` (DCP's files: one per rank and the ``.metadata`` index, resharded on load
when the number of ranks changes) beside the trainer's files, and model.pt with the whole weights for
``gptforge sample``. DCP reads its index with ``pickle.load``; here it is read by an unpickler that builds
DCP's own metadata classes and plain values only, so a checkpoint never runs code.
"""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from gptforge.core.findings import Finding, Severity
from gptforge.errors import GptforgeError, UsageError
from gptforge.reading import read_bytes
from gptforge.train import checkpoint
from gptforge.train.config import TrainConfig
from gptforge.train.engine import TorchEngine, compile_blocks
from gptforge.train.precision import Precision

STATE_DIR = "fsdp"
# FSDP2 warns of any view its root returns (logits[..., :vocab]); nothing here changes a model output in place
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")


def shard(model: torch.nn.Module, cfg: TrainConfig, precision: Precision, device: torch.device, world_size: int,
          compile_options: dict, unit: str = "model") -> list[Finding]:
    """Compile (when asked for) and shard MODEL in place; returns the startup notes. Call it before the
    optimizer is built: the parameters become DTensor shards.

    UNIT "block": each block its own FSDP unit, gathered before its forward and again before its backward, so at
    most about two blocks are whole at once (the least memory; a block's collectives overlap its neighbour's
    compute). "model": one unit, gathered once per
    step and kept whole through its micro batches, the forward compiled as one graph as under DDP (sharded
    optimizer state and gradients, whole weights while stepping: fewest collectives and hooks, for models whose
    whole bf16 weights fit beside the activations)."""
    mesh = init_device_mesh(device.type, (world_size,))
    low = precision.name in ("bf16", "fp16")
    policy = MixedPrecisionPolicy(param_dtype=precision.dtype, reduce_dtype=torch.float32) if low else MixedPrecisionPolicy()
    notes = []
    if unit == "block":
        notes += [compile_blocks(model, compile_options)] if cfg.compile else []
        last = len(model.blocks) - 1
        for i, block in enumerate(model.blocks):
            # the last block's weights are needed again at once by the backward: kept whole between the two
            fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=i < last)
        fully_shard(model, mesh=mesh, mp_policy=policy)
    else:
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
        if cfg.compile:  # the forward alone: FSDP's hooks run around it, outside the graph
            model.forward = torch.compile(model.forward, **compile_options)
            notes.append(Finding("compile-forward", Severity.INFO,
                                 "torch.compile: on, the whole forward as one graph (first steps include compilation)"))
    gathered = f"{precision.name} all-gathers, float32 reduce-scatters" if low else "float32 all-gathers and reduce-scatters"
    units = "one unit, whole weights kept through each step" if unit == "model" else "one unit per block"
    notes.append(Finding("fsdp", Severity.INFO, f"FSDP2 over {world_size} processes ({device.type}): parameters, "
                         f"gradients and optimizer state sharded, {units}; {gathered}"))
    return notes


class FSDPEngine(TorchEngine):
    """TorchEngine's step over sharded parameters: gradients reduce-scattered at the last micro batch only,
    the clipping norm summed over the shards, the state saved and loaded by every rank."""

    def __init__(self, model, optimizer, cfg: TrainConfig, precision: Precision, accum: int, unit: str = "model"):
        super().__init__(model, model, optimizer, cfg, precision, accum, ddp=False)
        self.keep_whole = unit == "model"
        self.whole_weights: dict | None = None

    def micro_step(self, x, y, is_last: bool) -> torch.Tensor:
        self.model.set_requires_gradient_sync(is_last)
        if self.keep_whole:  # the step's next micro batch uses the weights as they are: no gather again
            self.model.set_reshard_after_backward(is_last)
        return super().micro_step(x, y, is_last)

    def step(self) -> torch.Tensor:
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()  # the shards' partial norms combined over the ranks
        if self.clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.clip, norm, foreach=True)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm.detach()

    def state(self) -> tuple[dict | None, None, dict]:
        return self.whole_weights, None, self.schedule_state()

    def save_collective(self, tmp: Path) -> None:
        """Every rank writes its shards into TMP/fsdp; rank 0 also keeps the whole weights for model.pt."""
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp / STATE_DIR)
        self.whole_weights = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True,
                                                                                       cpu_offload=True))

    def load(self, ckpt: Path, trainer_state: dict) -> None:
        checkpoint.verify(ckpt)
        if not (ckpt / STATE_DIR).is_dir():
            raise UsageError("--resume", f"{ckpt} has no FSDP state", "resume an FSDP run with --fsdp, another run without it")
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, storage_reader=SafeReader(ckpt / STATE_DIR))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        self.load_schedule_state(trainer_state)


class MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes, torch.Size, dtypes, layouts, paths and plain containers; refuses any
    other global."""

    ALLOWED = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch.serialization", "_get_layout"),
               ("torch", "Size"), ("pathlib", "PosixPath"), ("collections", "OrderedDict")}

    def find_class(self, module: str, name: str):
        if module == dcp_metadata.__name__ and isinstance(getattr(dcp_metadata, name, None), type):
            return getattr(dcp_metadata, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"Unsupported global: {module}.{name}")


METADATA_MAX_BYTES = 1 << 30  # DCP's index grows with tensors x ranks; far below this for any run that fits a node


class SafeReader(FileSystemReader):
    def read_metadata(self, *args, **kwargs):
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        data = read_bytes(path, max_bytes=METADATA_MAX_BYTES, fix=checkpoint.DAMAGED)  # a FIFO, a device: refused
        try:
            metadata = MetadataUnpickler(io.BytesIO(data)).load()
        except pickle.UnpicklingError as err:
            raise GptforgeError(f"refused to read {path}: {err}", "use a checkpoint you trust, written by gptforge") from None
        except (EOFError, ValueError, TypeError, AttributeError, IndexError) as err:  # truncated or damaged opcodes
            raise GptforgeError(f"cannot read {path}: {type(err).__name__}: {str(err)[:120]}", checkpoint.DAMAGED) from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
