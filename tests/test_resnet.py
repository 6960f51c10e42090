"""Hybrid ResNet + ViT: official parameter counts, and the trunk's layers against their formulas."""

import keras
import numpy as np
import pytest

import keras_vit
from helpers import (
    OFFICIAL_HYBRID_COUNTS, assert_keras_file_round_trip, parameter_counts, randomise_weights,
)
from keras_vit.models import resnet

pytestmark = pytest.mark.gpu  # the accelerator subset (pyproject.toml's markers)


def _np(x):
    return keras.ops.convert_to_numpy(x)


def test_hybrid_parameter_count_equals_official():
    variants = sorted(OFFICIAL_HYBRID_COUNTS)
    counts = parameter_counts([{"variant": variant} for variant in variants])
    assert dict(zip(variants, counts)) == OFFICIAL_HYBRID_COUNTS


def test_r_ti16_stem_gives_a_7x7_grid_at_224():
    with keras.StatelessScope():
        model = keras_vit.ViT("R+Ti/16")
    assert model.get_layer("patch_encoder").grid_size == (7, 7)


def test_weight_standardisation_equals_its_formula():
    rng = np.random.default_rng(0)
    kernel = rng.normal(loc=0.3, scale=2.0, size=(3, 3, 4, 8)).astype("float32")
    expected = (kernel - kernel.mean(axis=(0, 1, 2))) / (kernel.std(axis=(0, 1, 2)) + 1e-5)
    np.testing.assert_allclose(_np(resnet.standardize_kernel(kernel)), expected, atol=1e-5)

    images = rng.normal(size=(2, 9, 9, 4)).astype("float32")
    conv = resnet.StdConv2D(8, 3, strides=2)
    conv.build(images.shape)
    conv.kernel.assign(kernel)
    plain = keras.layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)
    plain.build(images.shape)
    plain.kernel.assign(expected)
    np.testing.assert_allclose(_np(conv(images)), _np(plain(images)), atol=1e-4)


def test_group_norm_of_the_trunk_equals_its_formula():
    x = np.random.default_rng(1).normal(size=(2, 4, 4, 64)).astype("float32")
    norm = resnet._group_norm("gn")
    norm.build(x.shape)
    groups = x.reshape(2, 4, 4, 32, 2)
    mean = groups.mean(axis=(1, 2, 4), keepdims=True)
    var = groups.var(axis=(1, 2, 4), keepdims=True)
    expected = ((groups - mean) / np.sqrt(var + 1e-6)).reshape(x.shape)
    np.testing.assert_allclose(_np(norm(x)), expected, atol=1e-4)


def test_new_bottleneck_unit_passes_its_residual():
    # gn3's scale starts at zero, so a fresh unit without projection is relu(x).
    x = np.random.default_rng(2).normal(size=(1, 4, 4, 128)).astype("float32")
    np.testing.assert_array_equal(_np(resnet.BottleneckUnit(32)(x)), np.maximum(x, 0))


@pytest.mark.parametrize("size, strides, channels", [(7, 2, 64), (6, 2, 128), (5, 1, 128)])
def test_bottleneck_symbolic_output_is_what_it_returns(size, strides, channels):
    # Shapes from `compute_output_shape`, not a trace of `call`: odd sizes under stride 2
    # round as the convolution does.
    unit = resnet.BottleneckUnit(32, strides=strides)  # 32 groups: 32 features at least
    spec = unit(keras.KerasTensor((None, size, size, channels)))
    value = unit(np.ones((2, size, size, channels), "float32"))
    assert spec.shape == (None, *value.shape[1:])
    assert spec.dtype == keras.backend.standardize_dtype(value.dtype)


def test_tiny_hybrid_round_trips_through_keras_file(tmp_path):
    model = keras_vit.ViT(
        image_size=32, patch_size=1, hidden_dim=32, num_layers=1, num_heads=4, mlp_dim=64,
        num_classes=5, resnet_stages=(1, 1),
    )
    rng = randomise_weights(model, seed=3)
    x = rng.uniform(-1, 1, size=(2, 32, 32, 3)).astype("float32")
    assert_keras_file_round_trip(model, x, tmp_path / "hybrid.keras")


def test_hybrid_image_size_must_fit_the_trunk_stride():
    with pytest.raises(ValueError, match=r"image_size \(200, 200\) is not divisible by patch_size 16 \(ResNet trunk"):
        keras_vit.ViT("R50+B/16", image_size=200)
