"""Runs the layer and model tests under the JAX and PyTorch backends too.

Keras picks its backend once per process, so each backend gets its own pytest run.
Parameter counts depend only on the layers' shape logic, which is backend-independent,
so the slow count tests of the full-size variants run once, on TensorFlow.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

MULTI_BACKEND_TESTS = [
    "tests/test_layers.py", "tests/test_model.py", "tests/test_resnet.py",
    "tests/test_mixed_precision.py", "tests/test_backend_ops.py", "tests/test_dynamic_size.py",
    "tests/test_saved_families.py",
    # The families: the contract (tests/family_contract.py) and their references.
    "tests/test_deit.py", "tests/test_dinov2.py", "tests/test_eva.py", "tests/test_towers.py",
    "tests/test_dinov3.py", "tests/test_naflex.py", "tests/test_naflex_packing.py",
    "tests/test_naflex_timm.py",
    # PyTorch only (skipped elsewhere): the torch.compile'd steps against eager ones.
    "tests/test_torch_compile.py",
]
ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # a pytest run per backend, in subprocesses


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_layer_model_and_family_tests_pass_on(backend):
    env = {**os.environ, "KERAS_BACKEND": backend}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-m", "not slow or every_backend", "-k", "not parameter_count", *MULTI_BACKEND_TESTS],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    print(result.stdout[-3000:])
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
