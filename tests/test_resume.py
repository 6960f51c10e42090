"""A run killed at any moment resumes exactly: `keras-vit pretrain` SIGKILLed again and
again, at seeded points over its whole life, and rerun until it finishes, ends as the
uninterrupted run does, with every epoch logged once and no temporary file left.

Two ways to die: `KERAS_VIT_TEST_KILL_AT` (the test hook of `keras_vit.utils.files`) makes
the process SIGKILL itself half-way through writing a named file, and `KILL_AFTER_BATCH`
(this module's wrapper around the command) after a training batch.
"""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest

from helpers import COMMAND
from keras_vit.training import runs
from keras_vit.training.callbacks import TrainingBackup, read_metrics_csv

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "model.kwargs.hidden_dim=16", "model.kwargs.num_layers=1", "model.kwargs.num_heads=2",
    "model.kwargs.mlp_dim=32", "schedule.epochs=4", "schedule.micro_batches_per_epoch=4",
    "checkpointing.backup_every_micro_batches=2", "distribution.jit_compile=off",
    "distribution.deterministic=true", "seed=3",
]
# Micro-batches of 128, 1437 training digits: the first pass over the data ends in epoch
# 3 (0-based 2), epoch 4 is all in the second pass.
VARIANTS = dict(
    supervised=["data.batch_size=128", "evaluation.enabled=true"],
    mpp_accumulating=[
        "optimization.objective=mpp", "data.batch_size=256",
        "optimization.micro_batches_per_update=2", "evaluation.enabled=false",
    ],
)


# Each digit cropped at its own aspect to its own patch grid (the shifts per image), packed
# two to a row.
NAFLEX = [
    "data.batch_size=128", "evaluation.enabled=true", "data.naflex=true",
    "data.naflex_max_patches=16", "data.naflex_buckets=(9, 12)", "data.inception_crop=true",
    "data.crop_area=(0.5, 1.0)",
]
VARIANTS.update(naflex_packed=NAFLEX + ["data.images_per_row=2", "data.row_tokens=24"])


def _command(out, variant):
    sets = [arg for value in TINY + VARIANTS[variant] for arg in ("--set", value)]
    return ["pretrain", "--recipe", "demo", "--data", "digits", "--out", str(out), *sets]


def _start(out, variant, kill=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("KERAS_VIT_TEST_KILL_AT", None)
    if kill and kill[0] == "batch":
        env["KILL_AFTER_BATCH"] = str(kill[1])
    elif kill:
        env["KERAS_VIT_TEST_KILL_AT"] = f"{kill[0]}:{kill[1]}"
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(COMMAND), *_command(out, variant)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _kill_points(seed):
    """Where successive runs die, each counted from its own start: `(file pattern, n)`
    while writing the n-th such file, or `("batch", n)` after the n-th batch (batches a
    resumed run passes over count). Those in batches are drawn from `seed`."""
    rng = random.Random(seed)
    return [
        ("config.json", 1),  # before any training
        ("batch", rng.randint(3, 4)),  # epoch 1, after its step-2 backup
        ("state.npz", 2),  # a backup in epoch 2
        ("epoch_*.keras", 1),  # a checkpoint
        ("metrics.csv", 1),  # the metrics
        ("events.out.*", 1),  # TensorBoard scalars
        ("batch", rng.randint(3, 4)),  # late in an epoch, up to just before its end
        ("state.npz", 1),  # an end-of-epoch backup
        ("state.npz", 3),  # ... of epoch 3, where the first pass over the data ends
        ("batch", rng.randint(1, 4)),
        ("state.npz", 3),  # in epoch 4, the second pass
        ("model.keras", 1),  # the final model
        ("metrics.json", 1),  # the final metrics
    ]


def _events(folder):
    """`{(split, tag): [(step, value), ...]}` from every TensorBoard events file."""
    import tensorflow as tf

    scalars = {}
    for path in sorted(folder.glob("logs/*/*tfevents*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
                scalars.setdefault((path.parent.name, value.tag), []).append((event.step, number))
    return {key: sorted(points) for key, points in scalars.items()}


def _files(folder):
    """Every file's bytes, but the lock's (it names the last process that held the folder)."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*")) if path.is_file() and path.name != runs.LOCK
    }


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["supervised", "mpp_accumulating"])
def test_run_killed_anywhere_resumes_to_the_uninterrupted_run(tmp_path, variant):
    """The supervised run dies at every kind of point; the accumulating one only where its
    state differs from the supervised one's (after batches, half-way through an update, and
    in its backups): the files it writes are written by the same code."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    points = _kill_points(seed=len(variant))
    if variant == "mpp_accumulating":  # after odd batches: half-way through an update
        points = [("batch", 3), ("state.npz", 2), ("batch", 3), ("state.npz", 1),
                  ("state.npz", 3), ("batch", 1), ("state.npz", 2), ("batch", 3)]
    assert len(points) >= 8
    positions = _killed_then_finished(straight, killed, variant, points)
    print("backup after each kill:", list(zip(points, positions)))
    # The kills span the run: mid-epoch, in the second pass over the data and, for the
    # supervised run, before the first backup and once training was done (while the
    # final files were written).
    assert any(step for _, step in positions) and (3, 2) in positions
    assert positions[-1][0] >= 3
    if variant == "supervised":
        assert positions[0] == (0, 0) and positions[-2:] == [(4, 0), (4, 0)]
    _assert_same_run(straight, killed)
    # Nothing half-written left behind, and the run no longer has a backup to resume.
    names = [path.name for path in killed.rglob("*")]
    assert not [name for name in names if name.startswith(".tmp-") or "partial" in name]
    assert not (killed / runs.BACKUP / TrainingBackup.FILE).exists()

    if variant == "supervised":
        # Run once more: it is finished, so it says so and changes nothing.
        before = _files(killed)
        again = _start(killed, variant)
        _, stderr = again.communicate(timeout=900)
        assert again.returncode == 0, stderr[-3000:]
        assert "holds this finished run: nothing to do" in stderr
        assert _files(killed) == before


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["naflex_packed"])
def test_a_naflex_run_killed_mid_epoch_resumes_to_the_uninterrupted_run(tmp_path, variant):
    """Packed NaFlex batches resume exactly: killed after a batch of epoch 1, in a backup
    of epoch 2 and in the second pass over the data. (The padded pipeline's stream from
    batch n is tests/test_naflex_training.py's; the engine is the same for both.)"""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    points = [("batch", 3), ("state.npz", 2), ("state.npz", 3), ("batch", 2)]
    positions = _killed_then_finished(straight, killed, variant, points)
    assert positions[-1][0] >= 2  # the last kill in epoch 3 or 4
    _assert_same_run(straight, killed)


def _killed_then_finished(straight, killed, variant, points):
    """Runs `variant` uninterrupted into `straight` and, alongside, into `killed` killed at
    each of `points` in turn and then run to its end; returns the backup's position
    after each kill."""
    reference = _start(straight, variant)
    positions = []
    for point in points:
        process = _start(killed, variant, point)
        _, stderr = process.communicate(timeout=900)
        assert process.returncode == -signal.SIGKILL, (point, stderr[-3000:])
        positions.append(TrainingBackup.saved_position(str(killed / runs.BACKUP)))
    rerun = _start(killed, variant)
    _, stderr = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, stderr[-3000:]
    _, stderr = reference.communicate(timeout=900)
    assert reference.returncode == 0, stderr[-3000:]
    return positions


def _assert_same_run(straight, killed):
    """The run in `killed` ended as the uninterrupted one in `straight`: the same weights,
    every epoch once with the same values in metrics.csv, metrics.json and TensorBoard."""
    expected = keras.saving.load_model(straight / runs.MODEL).get_weights()
    resumed = keras.saving.load_model(killed / runs.MODEL).get_weights()
    assert len(resumed) == len(expected)
    for a, b in zip(expected, resumed):
        np.testing.assert_array_equal(a, b)
    # Every epoch once, with the uninterrupted run's values, in metrics.csv, metrics.json
    # and TensorBoard.
    assert [row["epoch"] for row in read_metrics_csv(str(killed / runs.METRICS_CSV))] == [0, 1, 2, 3]
    assert (killed / runs.METRICS_CSV).read_text() == (straight / runs.METRICS_CSV).read_text()
    history = json.loads((killed / runs.METRICS_JSON).read_text())["history"]
    assert history == json.loads((straight / runs.METRICS_JSON).read_text())["history"]
    assert all(len(values) == 4 for values in history.values())
    scalars = _events(killed)
    assert scalars == _events(straight)
    assert ("train", "epoch_loss") in scalars
    assert all([step for step, _ in points] == [0, 1, 2, 3] for points in scalars.values())
