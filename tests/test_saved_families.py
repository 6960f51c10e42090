"""Files of every family written by main at 43c1ca4 (before models and checkpoints were
reorganised into one module per family) load with today's code and give the outputs that
code computed. Runs on every backend (tests/test_backends_*.py).

The fixtures and the script that wrote them: tests/fixtures/README.md.
"""

import json
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_vit

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FAMILIES = ["vit", "deit", "deit3", "dinov2", "siglip", "clip", "eva02"]


def _saved(family):
    saved = np.load(FIXTURES / f"families_43c1ca4_{family}.npz")
    return saved["images"], saved["outputs"], json.loads(str(saved["vit_kwargs"]))


@pytest.mark.parametrize("family", FAMILIES)
def test_keras_file_of_43c1ca4_loads_with_the_same_outputs(family):
    images, outputs, _ = _saved(family)
    model = keras.saving.load_model(FIXTURES / f"families_43c1ca4_{family}.keras")
    got = keras.ops.convert_to_numpy(model(images, training=False))
    # The same float32 computation, on any backend: equal up to the order of summation.
    np.testing.assert_allclose(got, outputs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_npz_of_43c1ca4_loads_into_the_same_arguments_with_the_same_outputs(family):
    images, outputs, kwargs = _saved(family)
    model = keras_vit.ViT(**kwargs)
    before = keras.ops.convert_to_numpy(model(images, training=False))
    assert not np.allclose(before, outputs, atol=1e-3)  # only the load can match

    report = keras_vit.load_pretrained(model, FIXTURES / f"families_43c1ca4_{family}_weights.npz")
    assert not (report.missing or report.unexpected or report.mismatched)
    got = keras.ops.convert_to_numpy(model(images, training=False))
    np.testing.assert_allclose(got, outputs, rtol=1e-5, atol=1e-5)
