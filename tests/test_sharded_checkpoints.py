"""Sharded runs back up and checkpoint sharded: with FSDP on 4 host devices (JAX, one
process) the run folder's backup and its epoch checkpoints are written through Orbax, each
device's shards as they are; a run SIGKILLed mid-epoch, while writing its state file and
after its last backup resumes to the weights and metrics of the uninterrupted run, and
`--from` an unfinished run reads its newest sharded checkpoint into one host."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest

from keras_vit import cli
from keras_vit.training import runs
from keras_vit.training.callbacks import TrainingBackup
from keras_vit.utils.model_files import read_keras

pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

from helpers import COMMAND  # noqa: E402  (the pretrain command that can kill itself)

pytestmark = pytest.mark.slow  # subprocesses on 4 host devices

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = [
    "model.kwargs.hidden_dim=16", "model.kwargs.num_layers=1", "model.kwargs.num_heads=2",
    "model.kwargs.mlp_dim=32", "schedule.epochs=2", "schedule.micro_batches_per_epoch=4",
    "checkpointing.backup_every_micro_batches=2", "checkpointing.tensorboard=false",
    "data.batch_size=32", "evaluation.enabled=true", "distribution.strategy=fsdp", "seed=3",
]


def _start(out, kill=None, *more):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3",
           "KERAS_BACKEND": "jax", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    env.pop("KERAS_VIT_TEST_KILL_AT", None)
    if kill and kill[0] == "batch":
        env["KILL_AFTER_BATCH"] = str(kill[1])
    elif kill:
        env["KERAS_VIT_TEST_KILL_AT"] = f"{kill[0]}:{kill[1]}"
    sets = [arg for value in [*SETTINGS, *more] for arg in ("--set", value)]
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(COMMAND), "pretrain", "--recipe", "demo",
         "--data", "digits", "--out", str(out), *sets],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _backup_files(folder):
    state = dict(np.load(folder / runs.BACKUP / TrainingBackup.FILE))
    # Without the temporary file a kill while writing leaves (removed by the next run).
    return state, sorted(p.name for p in (folder / runs.BACKUP).iterdir() if ".tmp" not in p.name)


def _checkpoints(folder):
    return sorted(p.name for p in (folder / runs.CHECKPOINTS).iterdir()) if (
        folder / runs.CHECKPOINTS).exists() else []


def _predict(source, images, capsys):
    """`keras-vit predict --from source --json` of `images`, every class's probability."""
    capsys.readouterr()
    assert cli.main(["predict", "--from", str(source), *images, "--json", "--top-k", "10"]) == 0
    return json.loads(capsys.readouterr().out)


def test_fsdp_run_killed_resumes_from_sharded_backups_to_the_uninterrupted_run(
    tmp_path, capsys
):
    """Also: each epoch's checkpoint is a sharded folder (no `.keras` file gathered), pruned
    to `keep`; `predict --from` the run before its `model.keras` exists reads the newest
    one, and the last holds exactly the weights of the `model.keras` written (gathered)
    at the end."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    images = []
    for index in range(3):
        images.append(str(tmp_path / f"image{index}.png"))
        keras.utils.save_img(images[-1], np.random.default_rng(index).integers(0, 256, (8, 8, 3)))
    reference = _start(straight)
    seen, checkpoints = [], []
    for point in [("batch", 3), ("state.npz", 2), ("batch", 4)]:
        process = _start(killed, point, "checkpointing.keep_checkpoints=1")
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == -signal.SIGKILL, (point, stderr[-3000:])
        seen.append(_backup_files(killed))
        checkpoints.append(_checkpoints(killed))
    # Unfinished (killed in epoch 2): --from it is its epoch 1 checkpoint.
    assert runs.status(str(killed)) == "unfinished" and not (killed / runs.MODEL).exists()
    assert runs.resolve_from(str(killed)).path == str(killed / runs.CHECKPOINTS / "epoch_0001.orbax")
    killed_epoch_1 = _predict(killed, images, capsys)
    # The state file holds no arrays: it names the sharded folder of its position. The
    # kill while writing it left the newer folder beside the one in force, which the
    # next backup replaced; otherwise the folder named is the only one.
    assert [(int(s["epoch"]), int(s["step"])) for s, _ in seen] == [(0, 2), (1, 0), (1, 2)]
    for state, _ in seen:
        assert set(state) == {"epoch", "step", "sharded"}
        assert str(state["sharded"]) == f"sharded_{int(state['epoch']):04d}_{int(state['step']):08d}"
    assert [names for _, names in seen] == [
        ["sharded_0000_00000002", TrainingBackup.FILE],
        ["sharded_0001_00000000", "sharded_0001_00000002", TrainingBackup.FILE],
        ["sharded_0001_00000002", TrainingBackup.FILE],
    ]
    rerun = _start(killed, None, "checkpointing.keep_checkpoints=1")
    _, stderr = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, stderr[-3000:]
    _, stderr = reference.communicate(timeout=600)
    assert reference.returncode == 0, stderr[-3000:]
    assert "FullyShardedDataParallel, 4 devices" in stderr

    expected = keras.saving.load_model(straight / runs.MODEL).get_weights()
    resumed = keras.saving.load_model(killed / runs.MODEL).get_weights()
    assert len(resumed) == len(expected)
    for a, b in zip(expected, resumed):
        np.testing.assert_array_equal(a, b)
    assert (killed / runs.METRICS_CSV).read_text() == (straight / runs.METRICS_CSV).read_text()
    assert not (killed / runs.BACKUP).exists()  # the finished run removed its backup
    assert not [p for p in killed.rglob("*") if ".tmp" in p.name]

    # Sharded checkpoints, replaced when an epoch is rerun, pruned to keep=1 (3 by default).
    assert checkpoints == [[], ["epoch_0001.orbax"], ["epoch_0001.orbax"]]
    assert _checkpoints(killed) == ["epoch_0002.orbax"]
    assert _checkpoints(straight) == ["epoch_0001.orbax", "epoch_0002.orbax"]
    # The last checkpoint, read into one host, is the final model.keras, which the run
    # gathered and saved through another path.
    last = read_keras(str(straight / runs.CHECKPOINTS / "epoch_0002.orbax"))
    assert len(last.get_weights()) == len(expected)
    for a, b in zip(expected, last.get_weights()):
        np.testing.assert_array_equal(a, b)
    # --from the run with no model.keras yet: the same predictions as --from model.keras.
    unfinished = tmp_path / "unfinished"
    shutil.copytree(straight, unfinished, ignore=shutil.ignore_patterns(runs.MODEL))
    final = _predict(straight / runs.MODEL, images, capsys)
    assert _predict(unfinished, images, capsys) == final
    # The killed run's epoch 1, resumed exactly, predicted as the uninterrupted run's.
    straight_epoch_1 = straight / runs.CHECKPOINTS / "epoch_0001.orbax"
    assert killed_epoch_1 == _predict(straight_epoch_1, images, capsys)
    assert killed_epoch_1 != final
