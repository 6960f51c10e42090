"""FSDP on JAX: every weight and optimizer slot sharded over 4 host devices, training as
one device does (`keras_vit.training.jax_distribution.FullyShardedDataParallel`)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("jax")

HERE = os.path.dirname(os.path.abspath(__file__))


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
