"""Where a run's numbers go: a JSONL file (one line per step / eval), TensorBoard events, a loss plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

from gptforge.errors import GptforgeError
from gptforge.storage import atomic_path, write_atomic, writing


class MetricsLog:
    """Rank-0 writer of metrics.jsonl and TensorBoard events under the run directory."""

    def __init__(self, run_dir: Path, resume_step: int = 0):
        self.path = run_dir / "metrics.jsonl"
        self.truncate_after(resume_step)
        self.fh = open(self.path, "a")
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=resume_step + 1 if resume_step else None)

    def truncate_after(self, step: int) -> None:
        """Drop records a killed run wrote past the checkpoint it resumes from: the file stays one history.

        A torn last line (the writer died or the disk filled mid-write) is dropped too; a bad line
        anywhere else is damage this cannot judge, and stops the run."""
        if not self.path.exists():
            return
        lines = [line for line in self.path.read_text().splitlines(keepends=True) if line.strip()]
        kept = []
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except ValueError:
                if number == len(lines):
                    break
                raise GptforgeError(f"{self.path} line {number} is not JSON", "repair or remove that line, then --resume") from None
            if record["step"] <= step:
                kept.append(line if line.endswith("\n") else line + "\n")
        write_atomic(self.path, "".join(kept).encode())

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
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in records if kind is None or r["kind"] == kind]


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
