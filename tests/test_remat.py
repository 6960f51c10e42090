"""`--set model.kwargs.remat=true` (as the README writes it) on JAX trains to the weights
of the same run without it, dropout and stochastic depth included (their random draws are
the same)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "model.kwargs.hidden_dim=16", "model.kwargs.num_layers=2", "data.batch_size=32",
    "schedule.epochs=1", "schedule.micro_batches_per_epoch=3", "checkpointing.tensorboard=false",
    "model.kwargs.dropout_rate=0.1", "model.kwargs.drop_path_rate=0.1",
    "model.kwargs.attention_dropout_rate=0.1",
]


def _pretrain(out, *settings):
    sets = [arg for value in TINY + list(settings) for arg in ("--set", value)]
    return subprocess.Popen(
        [sys.executable, "-m", "keras_vit", "pretrain", "--recipe", "demo", "--out", str(out), *sets],
        env=dict(os.environ, PYTHONPATH=str(ROOT), KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.mark.slow
def test_remat_run_trains_to_the_weights_of_the_run_without(tmp_path):
    from keras_vit.training import runs
    from keras_vit.utils.model_files import read_keras

    plain, remat = tmp_path / "plain", tmp_path / "remat"
    procs = [_pretrain(plain), _pretrain(remat, "model.kwargs.remat=true")]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    expected = read_keras(str(plain / runs.MODEL))
    model = read_keras(str(remat / runs.MODEL))
    assert model.get_config()["remat"] is True and "remat" not in expected.get_config()
    for a, b in zip(expected.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
