"""Model tests: official parameter counts, save/load, bad input, and real training."""

import keras
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import keras_vit
from conftest import assert_keras_file_round_trip, randomise_weights, tiny_vit

# vit_jax models_test.py, num_classes=1000 at 224 px.
OFFICIAL_COUNTS = {
    "Ti/16": 5_717_416,
    "S/16": 22_050_664,
    "S/32": 22_878_952,
    "B/16": 86_567_656,
    "B/32": 88_224_232,
    "B/8": 86_576_872,
    "L/16": 304_326_632,
    "L/32": 306_535_400,
    "H/14": 632_045_800,
}


@pytest.mark.parametrize("variant", sorted(OFFICIAL_COUNTS))
def test_parameter_count_equals_official(variant):
    with keras.StatelessScope():  # shapes only: no weights are initialised
        model = keras_vit.ViT(variant)
    assert model.count_params() == OFFICIAL_COUNTS[variant]


def test_gap_parameter_count_equals_official():
    with keras.StatelessScope():
        model = keras_vit.ViT("B/16", classifier="gap")
    assert model.count_params() == 86_566_120


def test_output_shapes_for_heads_and_features():
    x = np.zeros((2, 32, 32, 3), "float32")
    assert tuple(tiny_vit()(x).shape) == (2, 10)
    assert tuple(tiny_vit(include_top=False, representation_size=24)(x).shape) == (2, 24)
    assert tuple(tiny_vit(include_top=False, pooling=False)(x).shape) == (2, 17, 32)
    tokens = tiny_vit(include_top=False, pooling=False, classifier="gap")(x)
    assert tuple(tokens.shape) == (2, 16, 32)
    rect = tiny_vit(image_size=(32, 48), channels=1)(np.zeros((1, 32, 48, 1), "float32"))
    assert tuple(rect.shape) == (1, 10)


def test_head_is_zero_initialised():
    out = keras.ops.convert_to_numpy(tiny_vit()(np.random.rand(2, 32, 32, 3)))
    np.testing.assert_array_equal(out, 0.0)


def test_preprocess_maps_pixel_range_to_unit_interval():
    pixels = np.array([0, 127.5, 255], "float32").reshape(1, 1, 3, 1)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(keras_vit.preprocess(pixels)).ravel(), [-1, 0, 1]
    )


def test_custom_model_round_trips_through_keras_file(tmp_path):
    model = tiny_vit(
        classifier="gap", pos_embedding="learned2d", representation_size=16,
        dropout_rate=0.1, drop_path_rate=0.1, gelu_approximate=True,
    )
    rng = randomise_weights(model, seed=0)
    x = rng.uniform(-1, 1, size=(3, 32, 32, 3)).astype("float32")
    assert_keras_file_round_trip(model, x, tmp_path / "vit.keras")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(variant="B/16", image_size=100), r"image_size \(100, 100\) is not divisible by patch_size 16"),
        (dict(variant="X/16"), r"Unknown ViT variant 'X/16': expected one of Ti/8, .*H/32"),
        (dict(variant="B/16", classifier="max"), r"Unknown classifier 'max': expected one of 'token', 'gap'"),
        (dict(variant="B/16", pos_embedding="rope"), r"Unknown pos_embedding 'rope': expected one of 'learned'"),
        (dict(variant="B/16", data_format="channels_first"), r"data_format 'channels_first' is not supported"),
        (dict(patch_size=4), r"Without a variant, ViT needs hidden_dim, num_layers, num_heads, mlp_dim"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, message):
    variant = kwargs.pop("variant", None)
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT(variant, **kwargs)


def test_wrong_channel_count_at_call_time_is_a_clear_error():
    model = tiny_vit()
    with pytest.raises(ValueError, match=r"3 channels.*got 1"):
        model(np.zeros((1, 32, 32, 1), "float32"))


@pytest.mark.slow  # trains to an accuracy
def test_tiny_vit_learns_digits():
    digits = load_digits()
    images = digits.images[..., None].astype("float32") / 8.0 - 1.0  # [0, 16] -> [-1, 1]
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    model = keras_vit.ViT(
        image_size=8, patch_size=2, hidden_dim=64, num_layers=2, num_heads=4,
        mlp_dim=128, num_classes=10, channels=1,
    )
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(x_train, y_train, batch_size=32, epochs=30, verbose=0)
    accuracy = model.evaluate(x_test, y_test, verbose=0)[1]
    print(f"\ndigits test accuracy ({keras.backend.backend()}): {accuracy:.4f}")
    # Chance is 0.1; the figure moves by a point or two with each backend's rounding.
    assert accuracy >= 0.93


def test_compiles_with_xla_by_default_except_on_torch():
    model = tiny_vit()
    model.compile()
    # Keras' own "auto" leaves XLA off for TensorFlow on a CPU-only machine.
    assert model.jit_compile is (keras.backend.backend() != "torch")
    model.compile(jit_compile=False)
    assert model.jit_compile is False


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_logits_are_float32_and_close_to_float32_model(policy):
    reference = tiny_vit()
    rng = randomise_weights(reference, seed=0, scale=0.1)  # non-zero head: informative logits
    keras.config.set_dtype_policy(policy)
    mixed = tiny_vit()
    mixed.set_weights(reference.get_weights())
    x = rng.uniform(-1, 1, size=(4, 32, 32, 3)).astype("float32")
    expected = keras.ops.convert_to_numpy(reference(x))
    scale = np.abs(expected).max()
    for logits in (mixed(x), mixed.predict(x, verbose=0)):
        assert keras.backend.standardize_dtype(logits.dtype) == "float32"
        error = np.abs(keras.ops.convert_to_numpy(logits) - expected).max()
        assert error < 0.03 * scale
