"""tasks/slurm_train.sbatch requeues a job that Slurm warns with SIGTERM before its time limit: the script passes
the signal on to the trainers (which save and exit, see tests/test_resume.py), waits for them and puts the job
back in the queue, where `--resume` continues. Slurm's own commands are stand-ins that record their calls."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tasks" / "slurm_train.sbatch"

SRUN = """#!/bin/bash
echo "$@" > "$CALLS/srun.args"
trap 'echo TERM > "$CALLS/srun.signal"; exit 75' TERM
touch "$CALLS/srun.started"
while true; do sleep 0.05; done
"""
SCONTROL = """#!/bin/bash
case "$1" in
  show) echo node001 ;;
  *) echo "$@" >> "$CALLS/scontrol.calls" ;;
esac
"""


def test_the_script_asks_slurm_for_a_warning_before_the_time_limit():
    directives = re.findall(r"^#SBATCH (\S+)", SCRIPT.read_text(), re.MULTILINE)
    assert any(re.fullmatch(r"--signal=B:TERM@\d+", d) for d in directives), directives
    assert "--requeue" in directives


def test_sigterm_reaches_the_trainers_and_the_job_is_requeued(tmp_path):
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir(), calls.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls), "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NAME": "t", "SLURM_JOB_NODELIST": "node001", "SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_ON_NODE": "1"}
    job = subprocess.Popen(["bash", str(SCRIPT), "--config", "gpt2-124m"], env=env, cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (calls / "srun.started").exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert job.poll() is None, job.communicate()[0]
        job.send_signal(signal.SIGTERM)  # what `--signal=B:TERM@...` sends the batch script
        out, _ = job.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)  # the stand-in srun too, whatever happened
        job.wait()
    assert (calls / "srun.signal").read_text().strip() == "TERM", out
    assert "--resume --config gpt2-124m" in (calls / "srun.args").read_text()
    assert (calls / "scontrol.calls").read_text().splitlines() == ["requeue 4242"], out
