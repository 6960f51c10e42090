"""`ViT(dynamic_image_size=True)`: one model for images of any size.

Its output at a size is checked against a model built at that size whose weights
`load_pretrained` resampled from the trained size's checkpoint (numpy, float64), on
every backend (tests/test_backends_*.py runs this file under JAX and PyTorch too).
"""

import keras
import numpy as np
import pytest

import keras_vit
from helpers import assert_keras_file_round_trip, randomise_weights, tiny_vit
from keras_vit.layers import posembed

pytestmark = pytest.mark.gpu  # the accelerator subset (pyproject.toml's markers)

# (height, width) at which the 32x32-trained tiny model runs: larger, non-square, smaller.
SIZES = [(48, 24), (16, 40)]
INTERPOLATIONS = posembed.INTERPOLATIONS


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _images(size, batch=2, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (batch, *size, 3)).astype("float32")


def _dynamic_and_checkpoint(tmp_path, **overrides):
    """A dynamic model with random weights, and the `.npz` of the same weights."""
    model = tiny_vit(dynamic_image_size=True, **overrides)
    randomise_weights(model, seed=0)
    path = tmp_path / "trained.npz"
    keras_vit.save_npz(model, path)
    return model, path


def _loaded_at(size, path, interpolation, **overrides):
    """A model built at `size` with the checkpoint loaded (and resampled) into it."""
    model = tiny_vit(image_size=size, **overrides)
    keras_vit.load_pretrained(model, path, interpolation=interpolation)
    return model


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize("size_in, size_out", [(4, 6), (4, 3), (14, 24), (6, 1), (1, 3), (5, 5)])
def test_weights_in_keras_ops_equal_the_numpy_weights(interpolation, size_in, size_out):
    weights = posembed.interpolation_weights
    expected = weights(size_in, size_out, interpolation)
    computed = _np(weights(size_in, size_out, interpolation, keras.ops, "float32"))
    np.testing.assert_allclose(computed, expected, rtol=0, atol=1e-5)  # float32 rounding
    if size_in == size_out:  # exactly the identity: the table itself at the trained grid
        np.testing.assert_array_equal(computed, np.eye(size_in))


@pytest.mark.parametrize(
    "interpolation, overrides",
    [
        ("bicubic_antialias", {}),
        ("bilinear_align_corners", {}),
        ("bicubic_antialias", dict(classifier="gap", pos_embedding="learned2d")),
        ("bilinear_align_corners", dict(pos_embedding="learned2d")),
        ("bicubic_antialias", dict(pos_embedding="sincos2d")),
        ("bicubic_antialias", dict(classifier="gap", pos_embedding="none")),
    ],
)
def test_output_at_each_size_equals_a_model_loaded_at_that_size(tmp_path, interpolation, overrides):
    model, path = _dynamic_and_checkpoint(tmp_path, pos_interpolation=interpolation, **overrides)
    for size in [(32, 32), *SIZES]:
        expected = _np(_loaded_at(size, path, interpolation, **overrides)(_images(size)))
        np.testing.assert_allclose(_np(model(_images(size))), expected, rtol=0, atol=1e-4)
    # At the trained size the position table is used as it is: the same model exactly.
    fixed = tiny_vit(**overrides)
    fixed.set_weights(model.get_weights())
    np.testing.assert_array_equal(_np(model(_images((32, 32)))), _np(fixed(_images((32, 32)))))


def test_hybrid_runs_at_multiples_of_its_trunk_stride(tmp_path):
    hybrid = dict(patch_size=2, resnet_stages=())  # stride 4 * 2 = 8: a 4x4 grid at 32 px
    model, path = _dynamic_and_checkpoint(tmp_path, **hybrid)
    size = (48, 24)
    expected = _np(_loaded_at(size, path, "bicubic_antialias", **hybrid)(_images(size)))
    np.testing.assert_allclose(_np(model(_images(size))), expected, rtol=0, atol=1e-4)


def test_padding_model_equals_the_model_on_zero_padded_images():
    model = tiny_vit(dynamic_image_size=True, dynamic_image_pad=True)
    randomise_weights(model, seed=0)
    unpadded = tiny_vit(dynamic_image_size=True)
    unpadded.set_weights(model.get_weights())
    images = _images((30, 17))
    padded = np.pad(images, [(0, 0), (0, 2), (0, 7), (0, 0)])
    np.testing.assert_array_equal(_np(model(images)), _np(unpadded(padded)))


def test_size_not_a_multiple_of_the_patch_is_a_clear_error():
    model = tiny_vit(dynamic_image_size=True)
    with pytest.raises(ValueError, match=r"height 30 is not divisible by patch_size 8.*dynamic_image_pad"):
        model(_images((30, 32)))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dynamic_image_pad=True), r"dynamic_image_pad=True .* needs dynamic_image_size=True"),
        (dict(dynamic_image_size=True, pos_interpolation="cubic"),
         r"Unknown pos_interpolation 'cubic': expected one of 'bilinear_align_corners'"),
    ],
)
def test_bad_dynamic_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_vit(**kwargs)


class _TwoSizes(keras.utils.PyDataset):
    """Batches of 32x32 and 48x24 images in turn."""

    def __len__(self):
        return 4

    def __getitem__(self, index):
        rng = np.random.default_rng(index)
        size = SIZES[0] if index % 2 else (32, 32)
        return rng.uniform(-1, 1, (4, *size, 3)).astype("float32"), rng.integers(0, 10, 4)


@pytest.mark.slow  # traces (under TensorFlow, compiles with XLA) a train step per size
@pytest.mark.every_backend
def test_trains_on_batches_of_two_sizes():
    model = tiny_vit(dynamic_image_size=True, pos_embedding="learned2d")
    randomise_weights(model, seed=0)
    before = [w.copy() for w in model.get_weights()]
    model.compile(
        keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    history = model.fit(_TwoSizes(), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = model.get_weights()
    assert all(not np.array_equal(a, b) for a, b in zip(before, after))
    images = _images((16, 40))
    np.testing.assert_allclose(model.predict(images, verbose=0), _np(model(images)), rtol=0, atol=1e-5)


def test_round_trips_through_keras_file(tmp_path):
    model = tiny_vit(dynamic_image_size=True, dynamic_image_pad=True, pos_interpolation="bilinear_align_corners")
    randomise_weights(model, seed=0)
    config = model.get_config()
    assert (config["dynamic_image_size"], config["dynamic_image_pad"]) == (True, True)
    assert model.input_shape == (None, None, None, 3)
    assert_keras_file_round_trip(model, _images(SIZES[0]), tmp_path / "dynamic.keras")
    loaded = keras.saving.load_model(tmp_path / "dynamic.keras")
    assert loaded.get_config() == config
    np.testing.assert_array_equal(_np(loaded(_images((15, 41)))), _np(model(_images((15, 41)))))


def test_feature_maps_follow_the_grid_of_each_input():
    model = tiny_vit(dynamic_image_size=True, num_layers=3)
    randomise_weights(model, seed=0)
    features = keras_vit.feature_model(model, layers=[0, -1], prefix_tokens=True)
    for size in SIZES:
        images = _images(size)
        maps = features(images)
        rows, cols = size[0] // 8, size[1] // 8
        assert [tuple(m.shape) for m, _ in maps] == [(2, rows, cols, 32)] * 2
        # The last block's class token is what the model's head reads after the norm.
        tokens = _np(maps[-1][1])[:, 0]
        head = model.parts.head
        logits = _np(head(model.parts.norm(keras.ops.convert_to_tensor(tokens))))
        np.testing.assert_allclose(logits, _np(model(images)), rtol=0, atol=1e-5)
        sequence = keras_vit.feature_model(model, output_format="NLC")(images)
        np.testing.assert_array_equal(_np(maps[-1][0]).reshape(2, -1, 32), _np(sequence))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="a TensorFlow graph")
@pytest.mark.parametrize(
    "overrides",
    [{}, dict(pos_embedding="sincos2d"), dict(pos_embedding="learned2d", classifier="gap"),
     dict(patch_size=2, resnet_stages=(), dynamic_image_pad=True)],
)
def test_tensorflow_graph_with_unknown_sizes_equals_eager_calls(overrides):
    import tensorflow as tf

    model = tiny_vit(dynamic_image_size=True, **overrides)
    randomise_weights(model, seed=0)
    traced = tf.function(
        lambda x: model(x, training=False),
        input_signature=[tf.TensorSpec((None, None, None, 3), tf.float32)],
    )
    sizes = [(32, 32), *SIZES] + ([(29, 41)] if overrides.get("dynamic_image_pad") else [])
    for size in sizes:
        np.testing.assert_allclose(traced(_images(size)).numpy(), _np(model(_images(size))),
                                   rtol=0, atol=1e-6)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="a TensorFlow graph")
def test_trained_grid_known_only_at_run_time_gives_the_table_exactly():
    import tensorflow as tf

    model = tiny_vit(dynamic_image_size=True)
    randomise_weights(model, seed=0)
    encoder = model.parts.patch_encoder
    table = tf.function(
        lambda rows, cols: encoder.position_table((rows, cols)),
        input_signature=[tf.TensorSpec((), tf.int32)] * 2,
    )
    np.testing.assert_array_equal(table(4, 4).numpy(), _np(encoder.position))


def test_tools_that_need_one_size_refuse_a_dynamic_model_clearly():
    encoder = tiny_vit(dynamic_image_size=True, include_top=False)
    with pytest.raises(ValueError, match=r"forward_flops counts the work at one input size; .*\(None, None, None, 3\)"):
        keras_vit.forward_flops(encoder)
    with pytest.raises(ValueError, match=r"MaskedPatchPrediction needs an encoder of one image size"):
        keras_vit.MaskedPatchPrediction(encoder)
