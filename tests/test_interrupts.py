"""Ctrl-C (SIGINT) and SIGTERM during `keras-vit pretrain` end it with one line saying
where the run stopped and the command that resumes it: no traceback, a non-zero exit
(128 + the signal), and that command then finishes the run. As a user meets it: the
`keras-vit` command of the built wheel in a fresh venv, an empty HOME, no KERAS_VIT_*
setting, run from a folder outside the checkout."""

import signal
import subprocess

import pytest
from helpers import clean_environment

TINY = [
    "model.kwargs.hidden_dim=16", "model.kwargs.num_layers=1", "model.kwargs.num_heads=2",
    "model.kwargs.mlp_dim=32", "schedule.epochs=2", "schedule.micro_batches_per_epoch=200",
    "checkpointing.backup_every_micro_batches=2", "checkpointing.tensorboard=false",
    "distribution.jit_compile=off", "data.batch_size=32", "evaluation.enabled=false",
]


def _pretrain(out):
    sets = [arg for value in TINY for arg in ("--set", value)]
    return ["pretrain", "--recipe", "demo", "--data", "digits", "--out", str(out), *sets]


def _start(installed, arguments, home):
    """`keras-vit ARGUMENTS` of the venv whose `bin` folder is `installed`."""
    return subprocess.Popen([str(installed / "keras-vit"), *arguments], cwd=home,
                            env=clean_environment(HOME=str(home)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_training_with_one_line_naming_the_resume_command(
        installed, tmp_path, signum):
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "run"
    process = _start(installed, _pretrain(out), home)
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
    resumed = _start(installed, line.split("Resume it with: keras-vit ")[1].split(), home)
    _, stderr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, stderr
    assert "Resumed from" in stderr
    assert (out / "model.keras").exists() and not backup.exists()
