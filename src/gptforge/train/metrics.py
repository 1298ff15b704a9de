"""Where a run's numbers go: a JSONL file (one line per step / eval), TensorBoard events, a loss plot."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from gptforge.errors import GptforgeError
from gptforge.reading import parse_json, read_bytes
from gptforge.storage import atomic_path, write_atomic, writing


MAX_METRICS_BYTES = 1 << 30  # far above a long run's one line per step


def step_line(r: dict, train_iters: int) -> str:
    """The log line of a step's record."""
    util = f"{r['mfu'] * 100:5.1f}% MFU" if r["mfu"] is not None else "MFU n/a"
    return (f"step {r['step']:>6}/{train_iters} | loss {r['loss']:.4f} | lr {r['lr']:.2e} | norm {r['grad_norm']:.3f} | "
            f"{r['tokens_per_s']:,.0f} tok/s | {r['step_ms']:.0f} ms | {util} | mem {r['mem_gib']:.2f} GiB")


class MetricsLog:
    """Rank-0 writer of metrics.jsonl and TensorBoard events under the run directory."""

    def __init__(self, run_dir: Path, resume_step: int = 0):
        self.path, self.plot_path = run_dir / "metrics.jsonl", run_dir / "loss.png"
        self.truncate_after(resume_step)
        self.fh = open(self.path, "a")
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=resume_step + 1 if resume_step else None)

    def plot(self, title: str) -> Path:
        return plot_losses(self.path, self.plot_path, title)

    def truncate_after(self, step: int) -> None:
        """Drop records a killed run wrote past the checkpoint it resumes from: the file stays one history.

        A torn last line (the writer died or the disk filled mid-write) is dropped too; a bad line
        anywhere else is damage this cannot judge, and stops the run."""
        if not os.path.lexists(self.path):
            return
        fix = "repair or remove that line, then --resume"
        lines = [line for line in read_bytes(self.path, max_bytes=MAX_METRICS_BYTES).splitlines(keepends=True) if line.strip()]
        kept = []
        for number, line in enumerate(lines, 1):
            try:
                record = parse_json(line, f"{self.path} line {number}", expect=dict, fix=fix)
                if isinstance(record.get("step"), bool) or not isinstance(record.get("step"), int):
                    raise GptforgeError(f"{self.path} line {number} has no integer \"step\"", fix)
            except GptforgeError:
                if number == len(lines):
                    break
                raise
            if record["step"] <= step:
                kept.append(line if line.endswith(b"\n") else line + b"\n")
        write_atomic(self.path, b"".join(kept))

    def write(self, record: dict) -> None:
        with writing(self.path):
            self.fh.write(json.dumps(record) + "\n")
            self.fh.flush()
        prefix = record["kind"]
        for key, value in record.items():
            if key not in ("kind", "step") and isinstance(value, (int, float)) and value is not None and math.isfinite(value):
                self.tb.add_scalar(f"{prefix}/{key}", value, record["step"])

    def close(self) -> None:
        self.fh.close()
        self.tb.close()


def read_records(path: Path, kind: str | None = None) -> list[dict]:
    """The records of a metrics file this run wrote (``truncate_after`` checked the lines before it)."""
    lines = read_bytes(path, max_bytes=MAX_METRICS_BYTES).splitlines()
    records = [parse_json(line, f"{path} line {n}", expect=dict) for n, line in enumerate(lines, 1) if line.strip()]
    return [r for r in records if kind is None or r.get("kind") == kind]


def plot_losses(metrics_path: Path, out_png: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = read_records(metrics_path, "train")
    evals = read_records(metrics_path, "eval")
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], lw=0.8, label="train loss")
    if evals:
        ax.plot([r["step"] for r in evals], [r["loss"] for r in evals], "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp)
    plt.close(fig)
    return out_png
