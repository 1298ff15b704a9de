"""Checkpoints that are either complete or absent.

Layout: ``RUN/checkpoints/step_00000100/`` holding model.pt, optimizer.pt, rng_rank<R>.pt and, written
last, trainer.pt (step, data position, scheduler, scaler, config, model shape). Every file is written
into ``.tmp-step_...``, fsynced, and the directory is renamed into place in one os.replace: a process
killed at any point leaves either the previous checkpoints or the new one, never a half-written
``step_*``. ``latest`` names the newest; old ones are renamed away before deletion (keep last K).

A checkpoint is untrusted input (run directories are shared and downloaded): every file is loaded
with ``torch.load(weights_only=True)``, which builds tensors and plain values and never runs code,
and ``checksums.json`` (sha256 of every file, written last before the rename) is checked before a
file is read, so damage is named instead of resumed from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import stat
import zipfile
from pathlib import Path

import numpy as np
import torch

from gptforge.errors import FileReadError, GptforgeError, UsageError
from gptforge.reading import read_json
from gptforge.storage import kill_point, publish_dir, write_atomic, writing
from gptforge.train import sizes

PREFIX = "step_"
TRAINER_FILE = "trainer.pt"
CHECKSUMS_FILE = "checksums.json"
DAMAGED = "the checkpoint is damaged or was changed after it was saved; use an older one"
STEP_DIR = re.compile(rf"{PREFIX}(\d+)", re.ASCII)
# trainer.pt: key -> the types its value may have (None: optional key)
TRAINER_KEYS = {"step": (int,), "consumed_samples": (int,), "model_shape": (dict,), "model_config": (dict,),
                "tokenizer": (dict,), "deepspeed": (bool,), "fsdp": (bool, None), "config": (dict,), "world_size": (int,),
                "scheduler": (dict, type(None)), "scaler": (dict, type(None), None)}


def step_dir_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_file(obj, path: Path) -> None:
    with writing(path, RuntimeError), open(path, "wb") as fh:  # torch.save reports a failed write as RuntimeError
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())


def sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def write_checksums(ckpt: Path) -> None:
    """sha256 of every file under ``ckpt`` (DeepSpeed's subdirectory included) into checksums.json."""
    files = sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != CHECKSUMS_FILE)
    listing = {str(p.relative_to(ckpt)): sha256(p) for p in files}
    write_atomic(ckpt / CHECKSUMS_FILE, json.dumps({"format": 1, "files": listing}, indent=1).encode())


def verify(ckpt: Path, names: list[str] | None = None) -> None:
    """Check ``names`` (default: every listed file) against checksums.json; a mismatch names the file."""
    listing_path = ckpt / CHECKSUMS_FILE
    try:
        listing = read_json(listing_path, expect=dict, fix=DAMAGED).get("files")
    except FileReadError as err:
        if err.code == "missing":
            raise GptforgeError(f"{listing_path} is missing, so {ckpt.name} cannot be checked", DAMAGED) from None
        raise
    if not isinstance(listing, dict) or not all(isinstance(v, str) for v in listing.values()):
        raise GptforgeError(f"{listing_path} is not a checksum list", DAMAGED)
    for name in names if names is not None else listing:
        path = ckpt / name
        if name not in listing:
            raise GptforgeError(f"{path} is not in {CHECKSUMS_FILE}", DAMAGED)
        if not path.is_file():
            raise GptforgeError(f"{path} is missing (listed in {CHECKSUMS_FILE})", DAMAGED)
        if sha256(path) != listing[name]:
            raise GptforgeError(f"{path}: checksum mismatch (sha256 differs from {CHECKSUMS_FILE})", DAMAGED)


def staging_dir(root: Path, step: int) -> Path:
    return root / f".tmp-{step_dir_name(step)}"


def begin(root: Path, step: int) -> Path:
    """Rank 0: an empty staging directory for the checkpoint of ``step``."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = staging_dir(root, step)
    remove_leftover(tmp)
    tmp.mkdir()
    return tmp


def commit(root: Path, step: int, keep_last: int) -> Path:
    """Rank 0, after every rank wrote its files: rename into place, point ``latest`` at it, prune."""
    tmp, final = staging_dir(root, step), root / step_dir_name(step)
    write_checksums(tmp)
    fsync_dir(tmp)
    publish_dir(tmp, final, replace=True)  # the same step saved again after a resume replaces it whole
    fsync_dir(root)
    write_atomic(root / "latest", (final.name + "\n").encode())
    prune(root, keep_last)
    return final


def complete_checkpoints(root: Path) -> list[Path]:
    """The checkpoints under ``root``, oldest first: real directories named step_N holding trainer.pt. A link
    named like one is not ours (it would be loaded, and pruning would delete what it points at)."""
    if not root.is_dir() or root.is_symlink():
        return []
    found = [p for p in root.iterdir() if STEP_DIR.fullmatch(p.name) and _real_dir(p) and (p / TRAINER_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def remove_leftover(path: Path) -> None:
    """Remove a name a killed save or prune left behind: a directory's tree, a file, or a link itself (never
    what it points at)."""
    if _real_dir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink(missing_ok=True)


def prune(root: Path, keep_last: int) -> None:
    for old in complete_checkpoints(root)[:-keep_last]:
        trash = root / f".trash-{old.name}"
        remove_leftover(trash)
        os.replace(old, trash)
        shutil.rmtree(trash, ignore_errors=True)


def clean_staging(root: Path) -> None:
    """Remove what a killed save or prune left behind (never a ``step_*`` directory)."""
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith((".tmp-", ".trash-", ".latest.tmp-")):  # .latest.tmp-: write_atomic's temp
                remove_leftover(p)


def latest(root: Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def resolve(path: Path) -> Path:
    """A run directory, its checkpoints/ directory or one step_* directory -> the checkpoint to read."""
    path = Path(path)
    if (path / TRAINER_FILE).is_file():
        return path
    for root in (path / "checkpoints", path):
        found = latest(root)
        if found is not None:
            return found
    raise GptforgeError(f"no complete checkpoint under {path}", "point at a run directory that saved one (save-interval)")


def check_unpacked(path: Path) -> None:
    """PATH is a zip file whose records are all stored as is, as torch.save writes them: a compressed record of
    a crafted file could unpack on loading to far more memory than the file's size."""
    try:
        with zipfile.ZipFile(path) as archive:
            packed = [i.filename for i in archive.infolist()
                      if i.compress_type != zipfile.ZIP_STORED or i.file_size != i.compress_size]
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise GptforgeError(f"cannot read {path}: not a file torch.save writes ({err})", DAMAGED) from None
    if packed:
        raise GptforgeError(f"refused to read {path}: its record {packed[0][:120]} is compressed, which torch.save "
                            "never writes (it could unpack past memory)", "use a checkpoint you trust, written by gptforge")


def load_file(path: Path):
    """One checkpoint file, tensors and plain values only: a file that holds anything else (code to
    run on unpickling) or is damaged is a one-line error naming it, never executed."""
    check_unpacked(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch.load raises whatever its unpickler meets in a damaged file
        if unsafe_globals(path):
            raise GptforgeError(f"refused to read {path}: it holds Python objects other than tensors and plain "
                                "values (loading them could run code)", "use a checkpoint you trust, written by gptforge") from None
        first_line = (str(err).strip().splitlines() or [""])[0][:120]
        raise GptforgeError(f"cannot read {path}: {type(err).__name__}: {first_line}", DAMAGED) from None


def unsafe_globals(path: Path) -> list[str]:
    """The names a file would import on unpickling beyond tensors and plain values, read from its opcodes
    without running any (so the refusal does not hang on the wording of one torch release's message)."""
    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not a torch zip file at all: damaged, not a payload
        return []


def read_trainer_state(ckpt: Path) -> dict:
    verify(ckpt, [TRAINER_FILE])
    state = load_file(ckpt / TRAINER_FILE)
    check_trainer_state(state, ckpt / TRAINER_FILE)
    return state


def check_engine(state: dict, ckpt: Path, deepspeed: bool, fsdp: bool) -> None:
    """CKPT (its trainer STATE) was written by the engine this run uses: DeepSpeed, FSDP or plain torch."""
    for key, engine, flag, used_now in (("deepspeed", "DeepSpeed", "--deepspeed CONFIG", deepspeed),
                                        ("fsdp", "FSDP", "--fsdp", fsdp)):
        used = state.get(key, False)
        if used != used_now:
            raise UsageError("--resume", f"{ckpt.name} was written {'with' if used else 'without'} {engine}",
                             f"resume with the same engine ({flag} or none)")


def check_trainer_state(state, path: Path) -> None:
    """Every key the trainer and ``sample`` read is there with its type: a damaged or foreign trainer.pt is a
    one-line error here, not a KeyError or TypeError later."""
    problem = _trainer_state_problem(state)
    if problem:
        raise GptforgeError(f"{path}: {problem}", "the checkpoint is damaged or not one gptforge wrote; use an older one")


def _trainer_state_problem(state) -> str | None:
    from gptforge.model.config import ModelConfig
    from gptforge.train.data import TokenizerSpec

    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, not a dict of trainer state"
    for key, types in TRAINER_KEYS.items():
        if key not in state:
            if None in types:
                continue
            return f"no {key!r} entry"
        if not isinstance(state[key], tuple(t for t in types if t is not None)) or \
                (isinstance(state[key], bool) and bool not in types):
            return f"{key!r} holds {type(state[key]).__name__} {state[key]!r:.40}"
    if state["step"] < 0 or state["consumed_samples"] < 0:
        return "a negative step or sample count"
    return (_fields_problem(state["model_config"], ModelConfig, "model_config")
            or _fields_problem(state["tokenizer"], TokenizerSpec, "tokenizer")
            or _prefixed("model_config", sizes.model_problem(state["model_config"])))


def _prefixed(name: str, problem: str | None) -> str | None:
    return f"{name}: {problem}" if problem else None


def _fields_problem(values: dict, cls, name: str) -> str | None:
    """``values`` can build ``cls``: the required fields present, no unknown ones, each of its annotated type."""
    types = {"int": int, "float": (int, float), "str": str}
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name not in values:
            if required:
                return f"{name} has no {f.name!r}"
            continue
        value = values[f.name]
        if isinstance(value, bool) or not isinstance(value, types[f.type]):
            return f"{name}[{f.name!r}] holds {type(value).__name__} {value!r:.40}"
    unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
    return f"{name} has unknown entries {sorted(unknown)}" if unknown else None


def check_shape(state: dict, expected_shape: dict, ckpt: Path) -> None:
    saved = state["model_shape"]
    diff = [f"{k}={saved.get(k)} (config: {v})" for k, v in expected_shape.items() if saved.get(k) != v]
    if diff:
        raise UsageError("--resume", f"checkpoint {ckpt.name} holds another model shape: {', '.join(diff)}",
                         "resume with the config it was trained with, or start a new --run-dir")


def seed_all(seed: int) -> None:
    """Every random number generator a step touches (python, numpy, torch CPU/CUDA): seeded, captured into
    rng_rank<R>.pt and restored from it."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def capture_rng() -> dict:
    """Plain values and tensors only, so that the file loads with ``torch.load(weights_only=True)``."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    numpy_state = (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached)
    state = {"python": random.getstate(), "numpy": numpy_state, "torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    with state_errors("the checkpoint's RNG state (rng_rank<R>.pt)"):
        random.setstate(state["python"])
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(state["torch_cpu"])
        if "torch_cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["torch_cuda"])


@contextlib.contextmanager
def state_errors(where: Path | str):
    """A saved state that loads (plain values and tensors) but does not fit what it is loaded into, wrong
    shapes, an empty optimizer state, a scheduler or RNG state of garbage, is one line naming it."""
    try:
        yield
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        if "can't allocate memory" in str(err):
            raise
        lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()] or [""]
        first_line = " ".join(lines[:2] if lines[0].endswith(":") else lines[:1])[:200]  # torch: "Error(s) in ...:"
        raise GptforgeError(f"{where}: the saved state does not fit this run ({type(err).__name__}: {first_line})",
                            "the checkpoint is damaged or not this run's; resume from an older one, or start a new "
                            "--run-dir") from None


def write_rank_files(tmp: Path, rank: int, rng_state: dict) -> None:
    save_file(rng_state, tmp / f"rng_rank{rank}.pt")


def write_main_files(tmp: Path, step: int, model_state: dict | None, optimizer_state: dict | None, trainer_state: dict) -> None:
    if model_state is not None:
        save_file(model_state, tmp / "model.pt")
    kill_point("save", step)
    if optimizer_state is not None:
        save_file(optimizer_state, tmp / "optimizer.pt")
    save_file(trainer_state, tmp / TRAINER_FILE)


def load_verified(ckpt: Path, name: str):
    verify(ckpt, [name])
    return load_file(ckpt / name)


def load_rank_rng(ckpt: Path, rank: int, saved_world_size: int) -> dict | None:
    """This rank's RNG state. Without it the resume cannot be exact, so a missing file is refused;
    a rank the saved run did not have (more processes now) has none, and gets None."""
    name = f"rng_rank{rank}.pt"
    if rank >= saved_world_size:
        return None
    if not (ckpt / name).is_file():
        raise GptforgeError(f"{ckpt / name} is missing: the resume would not be exact (dropout and data order "
                            "depend on it)", "resume from an older complete checkpoint")
    return load_verified(ckpt, name)
