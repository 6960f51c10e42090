"""FlexiViT patch-size resampling, against TensorFlow's bilinear resize."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import randomise_weights, tiny_vit

import keras_vit


@pytest.mark.parametrize("old, new", [((8, 8), (16, 12)), ((4, 4), (8, 8)), ((16, 16), (16, 32))])
def test_a_grown_patch_embeds_as_the_original(old, new):
    """<resize(x), w'> = <x, w> for patches resized with tf.image.resize (big_vision's)."""
    rng = np.random.default_rng(0)
    kernel = rng.normal(size=(*old, 3, 6))
    resampled = keras_vit.resample_patch_embedding(kernel, new)
    assert resampled.shape == (*new, 3, 6)
    patches = rng.uniform(-1, 1, (5, *old, 3))
    grown = tf.image.resize(patches, new, method="bilinear").numpy().astype("float64")
    np.testing.assert_allclose(
        np.einsum("bhwc,hwcd->bd", grown, resampled),
        np.einsum("bhwc,hwcd->bd", patches, kernel),
        rtol=1e-5, atol=1e-5,
    )


def test_a_shrunk_patch_embeds_as_the_least_squares_solution():
    """Shrinking cannot be exact: w' minimises |B^T w' - w| for TF's resize B."""
    rng = np.random.default_rng(1)
    kernel = rng.normal(size=(8, 8, 1, 2))
    resampled = keras_vit.resample_patch_embedding(kernel, 4)
    basis = np.eye(64).reshape(64, 8, 8, 1)
    resize = tf.image.resize(basis, (4, 4), method="bilinear").numpy().reshape(64, 16)
    solution, *_ = np.linalg.lstsq(resize, kernel.reshape(64, 2), rcond=None)
    np.testing.assert_allclose(resampled.reshape(16, 2), solution, atol=1e-6)


def test_load_pretrained_resamples_the_patch_embedding(tmp_path):
    checkpoint = tiny_vit(patch_size=4)
    randomise_weights(checkpoint, seed=2)
    keras_vit.save_npz(checkpoint, tmp_path / "p4.npz")
    model = tiny_vit(patch_size=8)  # a 4x4 grid instead of 8x8
    report = keras_vit.load_pretrained(model, tmp_path / "p4.npz")
    assert "patch embedding resampled from 4x4 to 8x8 patches (FlexiViT pseudo-inverse)." in report.messages
    old = np.asarray(checkpoint.parts.patch_embedding.kernel).reshape(4, 4, 3, 32)
    np.testing.assert_allclose(
        np.asarray(model.parts.patch_embedding.kernel).reshape(8, 8, 3, 32),
        keras_vit.resample_patch_embedding(old, 8), rtol=1e-6, atol=1e-6,
    )
    assert not report.mismatched


def test_bad_resampling_arguments_name_the_problem():
    with pytest.raises(ValueError, match=r"got shape \(16, 16, 3\)"):
        keras_vit.resample_patch_embedding(np.zeros((16, 16, 3)), 8)
    with pytest.raises(ValueError, match=r"new_patch_size must be a positive int or \(height, width\), got 0"):
        keras_vit.resample_patch_embedding(np.zeros((16, 16, 3, 4)), 0)
