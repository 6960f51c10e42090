"""FSDP on JAX: every weight and optimizer slot sharded over 4 host devices, training as
one device does (`keras_vit.training.jax_distribution.FullyShardedDataParallel`), in
`fit` and through `keras-vit pretrain --set distribution.strategy=fsdp`."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("jax")

pytestmark = pytest.mark.slow  # subprocesses on 4 host devices

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TINY = [
    "--recipe", "demo", "--set", "model.kwargs.hidden_dim=16", "--set", "model.kwargs.num_layers=1",
    "--set", "data.batch_size=32", "--set", "schedule.epochs=2",
    "--set", "schedule.micro_batches_per_epoch=4", "--set", "checkpointing.tensorboard=false",
]


def _pretrain(out, *settings, devices=1):
    return subprocess.Popen(
        [sys.executable, "-m", "keras_vit", "pretrain", *TINY, "--out", str(out), *settings],
        env=dict(os.environ, PYTHONPATH=ROOT, KERAS_BACKEND="jax",
                 XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.fixture(scope="module")
def engine_runs(tmp_path_factory):
    """The engine's run on one device and with FSDP on 4 (started at once)."""
    one, fsdp = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("fsdp")
    procs = [_pretrain(one), _pretrain(fsdp, "--set", "distribution.strategy=fsdp", devices=4)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    return one, fsdp, err


@pytest.fixture(scope="module")
def fsdp_run():
    job = subprocess.run(
        [sys.executable, os.path.join(HERE, "jax_distribution_job.py"), "fsdp"],
        env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)), capture_output=True, text=True,
        timeout=600,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    return json.loads(job.stdout.strip().splitlines()[-1])


def test_fsdp_trains_as_one_device(fsdp_run):
    """The loss curve and the weights of one device (to float32 reduction order)."""
    np.testing.assert_allclose(fsdp_run["fsdp"], fsdp_run["one"], rtol=1e-5)
    assert fsdp_run["weights_max_difference"] < 1e-5


def test_fsdp_divides_per_device_bytes_by_the_shard_count(fsdp_run):
    """Each weight and slot with a dimension that 4 divides holds a quarter per device
    (the others are whole); all together a device holds under 1/3.9 of the model."""
    full = device = 0
    for path, placed in fsdp_run["bytes"].items():
        assert len(placed["device"]) == 4, path
        divisible = any(size % 4 == 0 for size in placed["shape"])
        expected = placed["full"] // 4 if divisible else placed["full"]
        assert placed["device"] == [expected] * 4, path
        full, device = full + placed["full"], device + expected
    assert full / device > 3.9


def test_engine_with_fsdp_trains_as_one_device(engine_runs):
    """`--set distribution.strategy=fsdp` on 4 devices: one device's weights and metrics."""
    from keras_vit.utils.model_files import read_keras

    one, fsdp, err = engine_runs
    assert "FullyShardedDataParallel, 4 devices" in err
    weights = [read_keras(str(out / "model.keras")).get_weights() for out in (one, fsdp)]
    for a, b in zip(*weights, strict=True):
        np.testing.assert_allclose(b, a, atol=1e-5)
    metrics = [json.loads((out / "metrics.json").read_text())["final"] for out in (one, fsdp)]
    assert metrics[1].keys() == metrics[0].keys()
    for name, value in metrics[0].items():
        np.testing.assert_allclose(metrics[1][name], value, rtol=1e-5)
