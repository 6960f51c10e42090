"""Ctrl-C (SIGINT) and SIGTERM during `keras-vit pretrain` end it with one line saying
where the run stopped and the command that resumes it: no traceback, a non-zero exit
(128 + the signal), and that command then finishes the run."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "model.kwargs.hidden_dim=16", "model.kwargs.num_layers=1", "model.kwargs.num_heads=2",
    "model.kwargs.mlp_dim=32", "schedule.epochs=2", "schedule.micro_batches_per_epoch=400",
    "checkpointing.backup_every_micro_batches=2", "checkpointing.tensorboard=false",
    "distribution.jit_compile=off", "data.batch_size=32", "evaluation.enabled=false",
]


def _pretrain(out):
    sets = [arg for value in TINY for arg in ("--set", value)]
    return ["pretrain", "--recipe", "demo", "--data", "digits", "--out", str(out), *sets]


def _start(arguments):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen([sys.executable, "-m", "keras_vit", *arguments], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_training_with_one_line_naming_the_resume_command(tmp_path, signum):
    out = tmp_path / "run"
    process = _start(_pretrain(out))
    backup = out / "backup" / "state.npz"
    # Training is under way once its first backup (after 2 micro-batches) is written.
    while not backup.exists() and process.poll() is None:
        try:
            process.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
    assert process.poll() is None, process.communicate()
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    (line,) = [x for x in stderr.splitlines() if x.startswith("keras-vit pretrain:")]
    command = "keras-vit " + " ".join(_pretrain(out))
    assert line.startswith(
        f"keras-vit pretrain: {signal.Signals(signum).name}: Interrupted: the run in {out} "
        "stopped; its backup resumes it at epoch 1, micro-batch ")
    assert line.endswith(f". Resume it with: {command}")
    # The command it names resumes the run and finishes it.
    resumed = _start(line.split("Resume it with: keras-vit ")[1].split())
    _, stderr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, stderr
    assert "Resumed from" in stderr
    assert (out / "model.keras").exists() and not backup.exists()
