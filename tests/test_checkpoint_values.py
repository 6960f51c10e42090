"""A checkpoint holding NaN or infinite weights (what a diverged run saves) is refused
by default and loads only with `strict=False`, with a warning naming the tensors."""

import logging

import numpy as np
import pytest

import keras_vit
from keras_vit.training import runs
from helpers import tiny_vit

QUERY = "Transformer/encoderblock_1/MultiHeadDotProductAttention_1/query/kernel"
POS = "Transformer/posembed_input/pos_embedding"


def broken_npz(tmp_path, key, value):
    path = tmp_path / "vit.npz"
    keras_vit.save_npz(tiny_vit(), path)
    arrays = dict(np.load(path))
    arrays[key].flat[3] = value
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("key, value", [(QUERY, np.nan), (POS, np.inf)])
def test_a_checkpoint_with_non_finite_weights_is_refused_by_default(tmp_path, key, value):
    path = broken_npz(tmp_path, key, value)
    model = tiny_vit()
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match=f"holds NaN or infinite values in {key}; pass "
                                         "strict=False to load it anyway"):
        keras_vit.load_pretrained(model, path)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_strict_false_loads_it_with_a_warning(tmp_path, caplog):
    path = broken_npz(tmp_path, QUERY, np.nan)
    model = tiny_vit()
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        report = keras_vit.load_pretrained(model, path, strict=False)
    expected = (f"Checkpoint {path} holds NaN or infinite values in {QUERY}: the model "
                "will not give finite outputs.")
    assert expected in report.messages
    assert expected in caplog.text
    assert any(np.isnan(w).any() for w in model.get_weights())


def test_a_run_does_not_start_from_a_keras_file_with_non_finite_weights(tmp_path):
    saved = tiny_vit()
    head = saved.get_layer("head").kernel
    head.assign(np.full(head.shape, np.nan, "float32"))
    path = str(tmp_path / "diverged.keras")
    saved.save(path)
    with pytest.raises(ValueError, match=r"diverged.keras holds NaN or infinite values in "
                                         r"head/kernel: a diverged run saves such weights; "
                                         r"use an earlier checkpoint of the run"):
        runs.load_weights(tiny_vit(), path)
