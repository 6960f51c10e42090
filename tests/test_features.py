"""feature_model: the token features after chosen blocks, checked against the blocks
called one by one and against the model's own pooled output."""

import keras
import numpy as np
import pytest
from helpers import randomise_weights, tiny_vit

import keras_vit


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _tokens_by_hand(model, images):
    """Each block's output tokens, calling the model's layers one after another."""
    parts = model.parts
    x = images
    if parts.stem is not None:
        for layer in model.layers[1 : model.layers.index(parts.patches)]:
            x = layer(x)
    x = parts.patch_encoder(parts.patches(x))
    if parts.class_token is not None:
        x = parts.class_token(x)
    outputs = []
    for block in parts.blocks:
        x = block(x)
        outputs.append(_np(x))
    return outputs


def test_maps_and_sequences_are_the_block_outputs_in_patch_order():
    model = tiny_vit(num_layers=3, image_size=(32, 48))
    rng = randomise_weights(model, seed=0)
    images = rng.uniform(-1, 1, (2, 32, 48, 3)).astype("float32")
    expected = _tokens_by_hand(model, images)
    maps = keras_vit.feature_model(model, layers=[0, -1])(images)
    sequences = keras_vit.feature_model(model, layers=2, output_format="NLC", prefix_tokens=True)(images)
    assert [tuple(m.shape) for m in maps] == [(2, 4, 6, 32)] * 2
    for got, block in zip(maps, (0, 2)):
        got = _np(got)
        for r in range(4):
            for c in range(6):  # row-major: patch (r, c) is token 1 + r * cols + c
                np.testing.assert_allclose(got[:, r, c], expected[block][:, 1 + r * 6 + c], atol=1e-5)
    for (features, prefix), block in zip(sequences, (1, 2)):
        np.testing.assert_allclose(_np(features), expected[block][:, 1:], atol=1e-5)
        np.testing.assert_allclose(_np(prefix), expected[block][:, :1], atol=1e-5)


def test_normalised_last_map_of_a_gap_model_averages_to_its_pooled_features():
    model = tiny_vit(classifier="gap", include_top=False)
    rng = randomise_weights(model, seed=1)
    images = rng.uniform(-1, 1, (3, 32, 32, 3)).astype("float32")
    last = keras_vit.feature_model(model, norm=True)(images)
    np.testing.assert_allclose(_np(last).mean(axis=(1, 2)), _np(model(images)), atol=1e-5)
    _, prefix = keras_vit.feature_model(model, prefix_tokens=True)(images)
    assert tuple(prefix.shape) == (3, 0, 32)  # a gap model has no class token


def test_hybrid_maps_follow_the_trunk():
    model = tiny_vit(patch_size=1, resnet_stages=(), image_size=32)
    rng = randomise_weights(model, seed=2)
    images = rng.uniform(-1, 1, (1, 32, 32, 3)).astype("float32")
    features = keras_vit.feature_model(model, output_format="NLC")(images)
    np.testing.assert_allclose(_np(features), _tokens_by_hand(model, images)[-1][:, 1:], atol=1e-5)
    assert tuple(keras_vit.feature_model(model)(images).shape) == (1, 8, 8, 32)


def test_bad_feature_arguments_name_the_problem():
    model = tiny_vit()
    with pytest.raises(ValueError, match=r"Block index 2 is out of range for a model with 2 blocks"):
        keras_vit.feature_model(model, layers=[0, 2])
    with pytest.raises(ValueError, match=r"layers=3 asks for the last 3 blocks of a model with 2"):
        keras_vit.feature_model(model, layers=3)
    with pytest.raises(ValueError, match=r"Unknown output_format 'NCHW': expected one of 'NHWC', 'NLC'"):
        keras_vit.feature_model(model, output_format="NCHW")
