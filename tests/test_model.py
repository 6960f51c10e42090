"""Model tests: official parameter counts, save/load, the declared structure, bad input,
and real training."""

import os
import re

import keras
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import keras_vit
from helpers import (
    OFFICIAL_COUNTS, assert_keras_file_round_trip, compute_device, parameter_counts,
    randomise_weights, tiny_vit,
)

pytestmark = pytest.mark.gpu  # the accelerator subset (pyproject.toml's markers)


def test_parameter_count_equals_official():
    variants = sorted(OFFICIAL_COUNTS)
    counts = parameter_counts([{"variant": variant} for variant in variants])
    assert dict(zip(variants, counts)) == OFFICIAL_COUNTS


def test_gap_parameter_count_equals_official():
    assert parameter_counts([{"variant": "B/16", "classifier": "gap"}]) == [86_566_120]


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
    # Exact on CPUs; XLA:GPU's float32 division is within one unit in the last place.
    np.testing.assert_array_max_ulp(
        keras.ops.convert_to_numpy(keras_vit.preprocess(pixels)).ravel(),
        np.array([-1, 0, 1], "float32"),
        maxulp=0 if compute_device() == "cpu" else 1,
    )


def test_custom_model_round_trips_through_keras_file(tmp_path):
    model = tiny_vit(
        classifier="gap", pos_embedding="learned2d", representation_size=16,
        dropout_rate=0.1, drop_path_rate=0.1, gelu_approximate=True,
    )
    rng = randomise_weights(model, seed=0)
    x = rng.uniform(-1, 1, size=(3, 32, 32, 3)).astype("float32")
    assert_keras_file_round_trip(model, x, tmp_path / "vit.keras")


# Architectures that exercise every argument the config carries.
ARCHITECTURES = {
    "plain": dict(representation_size=16, dropout_rate=0.1, drop_path_rate=0.2,
                  attention_dropout_rate=0.05, gelu_approximate=True, head_bias_init=-2.0),
    "gap_learned2d": dict(classifier="gap", pos_embedding="learned2d", image_size=(32, 48)),
    "tokens": dict(include_top=False, pooling=False, pos_embedding="sincos2d", channels=1),
    "features": dict(include_top=False, num_layers=3, pos_embedding="none"),
    "hybrid": dict(patch_size=1, resnet_stages=(1, 1), num_classes=3, image_size=64),
    "variant": dict(variant="R+Ti/16", image_size=32, num_layers=1, name="vit-R+Ti_16"),
}


def _outputs(model, seed=1):
    x = np.random.default_rng(seed).uniform(-1, 1, (2, *model.input_shape[1:]))
    return keras.ops.convert_to_numpy(model(x.astype("float32")))


def test_vit_arguments_are_the_architecture_fields_with_the_same_defaults():
    """`ViT`'s keyword arguments are `Architecture`'s fields and the Keras model's own
    (`name`, `dtype`, `quantized`), with the same defaults: one description."""
    import dataclasses
    import inspect

    from keras_vit.models.architecture import MODEL_ARGUMENTS, Architecture

    parameters = inspect.signature(keras_vit.VisionTransformer.__init__).parameters
    given = {k: p.default for k, p in parameters.items() if k not in ("self", "kwargs")}
    fields = {f.name: f.default for f in dataclasses.fields(Architecture)}
    assert {k: v for k, v in given.items() if k not in MODEL_ARGUMENTS} == fields


@pytest.mark.parametrize("arguments", [
    dict(variant="R+Ti/16", image_size=32, num_layers=1),
    dict(patch_size=8, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=64, image_size=(32, 48),
         distilled=True, num_registers=2, layer_scale_init=1e-6, dynamic_image_size=1, remat=True),
    dict(variant="Ti/16", rope=True, rope_reference_grid=14, classifier="avg", fc_norm=True,
         preprocessing={"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}),
])
def test_an_architecture_rebuilds_from_its_config(arguments):
    """`Architecture(**arch.get_config())` is the same description: normalising twice
    changes nothing, and what `get_config` leaves out are the defaults."""
    from keras_vit.models.architecture import Architecture

    arch = Architecture(**arguments)
    assert Architecture(**arch.get_config()) == arch


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_config_keeps_the_architecture_and_rebuilds_the_model(name):
    kwargs = dict(ARCHITECTURES[name])
    variant = kwargs.pop("variant", None)
    model = tiny_vit(**kwargs) if variant is None else keras_vit.ViT(variant, **kwargs)
    randomise_weights(model, seed=0)
    config = model.get_config()
    assert "layers" not in config
    for key, value in kwargs.items():
        expected = (value, value) if key == "image_size" and isinstance(value, int) else value
        assert config[key] == expected, key
    assert config["variant"] == variant
    rebuilt = keras_vit.VisionTransformer.from_config(config)
    assert rebuilt.get_config() == config
    assert [v.path for v in rebuilt.weights] == [v.path for v in model.weights]
    rebuilt.set_weights(model.get_weights())
    np.testing.assert_array_equal(_outputs(rebuilt), _outputs(model))
    # The layer graph keras-vit 0.1.0 saved (a functional config of the same graph)
    # rebuilds the same architecture.
    graph = keras.Model(model.inputs, model.outputs, name=model.name).get_config()
    assert "layers" in graph
    recovered = keras_vit.VisionTransformer.from_config(graph).get_config()
    if not config["include_top"]:  # a model without a head keeps no class count
        for key in ("num_classes", "head_bias_init"):
            recovered.pop(key), config.pop(key)
    assert recovered == config


@pytest.mark.parametrize("name", ["plain", "hybrid"])
def test_keras_files_of_version_0_1_0_load_with_the_same_outputs(name):
    """Fixtures saved by keras-vit 0.1.0 (tests/fixtures/vit_v0_1_0_make.py)."""
    fixtures = os.path.join(os.path.dirname(__file__), "fixtures")
    model = keras.saving.load_model(os.path.join(fixtures, f"vit_v0_1_0_{name}.keras"))
    saved = np.load(os.path.join(fixtures, f"vit_v0_1_0_{name}.npz"))
    outputs = keras.ops.convert_to_numpy(model(saved["images"]))
    # The same weights; float32 rounding differs between backends and between CPUs (the
    # TensorFlow that wrote them gives other last bits on a CPU with other vector units).
    np.testing.assert_allclose(outputs, saved["outputs"], rtol=1e-5, atol=1e-6)
    assert isinstance(model, keras_vit.VisionTransformer)
    config = model.get_config()
    if name == "plain":
        assert (config["image_size"], config["representation_size"]) == ((16, 24), 8)
        assert (config["head_bias_init"], config["gelu_approximate"]) == (-1.0, True)
        assert (config["dropout_rate"], config["drop_path_rate"]) == (0.1, 0.1)
        assert len(model.parts.blocks) == 2 and model.parts.stem is None
    else:
        assert (config["resnet_stages"], config["classifier"]) == ((), "gap")
        assert config["pos_embedding"] == "learned2d" and model.parts.head is None


def test_parts_are_the_layers_by_role():
    model = tiny_vit(patch_size=1, resnet_stages=(1, 2), image_size=64, representation_size=8)
    parts = keras_vit.vit_parts(model)
    layers = model.layers
    blocks = [layer for layer in layers if isinstance(layer, keras_vit.TransformerBlock)]
    assert parts.blocks == tuple(blocks)
    assert parts.head is layers[-1] and parts.pre_logits is layers[-2]
    assert parts.pool is layers[-3] and parts.norm is layers[-4]
    assert parts.patches.output is parts.patch_encoder.input
    assert parts.patch_embedding is parts.patch_encoder.projection
    assert parts.class_token.input is parts.patch_encoder.output
    assert parts.encoder == (parts.class_token, parts.dropout, *blocks, parts.norm)
    assert parts.stem.root_conv is layers[1] and parts.stem.root_norm is layers[2]
    assert [len(stage) for stage in parts.stem.stages] == [1, 2]
    assert parts.stem.stages[-1][-1].output is parts.patches.input
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(parts.position_table()),
        keras.ops.convert_to_numpy(parts.patch_encoder.position),
    )
    # The declared kernels are the weights named "kernel" (what weight decay chose
    # by name in 0.1.0): the trunk's convolutions and every Dense.
    assert {v.path for v in model.kernels()} == {
        v.path for v in model.weights if v.path.endswith("/kernel")
    }
    with pytest.raises(ValueError, match=r"Model 'plain' \(Sequential\) is not a keras_vit.ViT"):
        keras_vit.vit_parts(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="plain"))


def test_tensor_parallel_layout_matches_every_block_projection():
    from keras_vit.training.jax_distribution import VIT_LAYOUT

    model = tiny_vit(num_layers=3)
    for key, axes in VIT_LAYOUT.items():
        matched = [v for v in model.weights if re.search(key, v.path)]
        expected = [
            getattr(layer, key.rsplit("/", 1)[1])
            for block in model.parts.blocks for layer in block.projections()
            if f"/{layer.name}/" in key
        ]
        assert len(matched) == 3 and [id(v) for v in matched] == [id(v) for v in expected]
        assert len(axes) == len(matched[0].shape)


def test_mixed_precision_policy_is_kept_by_the_keras_file(tmp_path):
    keras.config.set_dtype_policy("mixed_float16")
    model = tiny_vit()
    model.save(tmp_path / "mixed.keras")
    keras.config.set_dtype_policy("float32")
    loaded = keras.saving.load_model(tmp_path / "mixed.keras")
    assert loaded.get_config()["dtype"]["config"]["name"] == "mixed_float16"
    assert loaded.parts.blocks[0].compute_dtype == "float16"
    assert loaded.parts.blocks[0].qkv.compute_dtype == "float16"
    assert loaded.parts.head.compute_dtype == "float32"
    assert keras.config.dtype_policy().name == "float32"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(variant="B/16", image_size=100), r"image_size \(100, 100\) is not divisible by patch_size 16"),
        (dict(variant="X/16"), r"Unknown ViT variant 'X/16': expected one of Ti/8, .*H/32"),
        (dict(variant="B/16", classifier="max"), r"Unknown classifier 'max': expected one of 'token', 'gap'"),
        (dict(variant="B/16", pos_embedding="rope"), r"Unknown pos_embedding 'rope': expected one of 'learned'"),
        (dict(variant="B/16", data_format="channels_first"), r"data_format 'channels_first' is not supported"),
        (dict(variant="Ti/16", remat="false"), r"remat must be True or False, got 'false'"),
        (dict(patch_size=4), r"Without a variant, ViT needs hidden_dim, num_layers, num_heads, mlp_dim"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, message):
    variant = kwargs.pop("variant", None)
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT(variant, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_layer=1), r"unknown argument 'num_layer': did you mean 'num_layers'\?"),
    (dict(colour=3), r"unknown argument 'colour': see help\(keras_vit.VisionTransformer\)"),
])
def test_an_unknown_argument_is_named_not_ignored(kwargs, message):
    # Keras' Model takes and drops keywords it does not know: a misspelt one would
    # silently build another model.
    with pytest.raises(TypeError, match=message):
        keras_vit.ViT("Ti/16", image_size=32, **kwargs)


def test_wrong_channel_count_at_call_time_is_a_clear_error():
    model = tiny_vit()
    with pytest.raises(ValueError, match=r"3 channels.*got 1"):
        model(np.zeros((1, 32, 32, 1), "float32"))


@pytest.mark.slow  # trains to an accuracy
@pytest.mark.every_backend
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


@pytest.mark.parametrize("batch_size, steps", [(None, None), (16, None), (16, 2)])
def test_predict_and_evaluate_on_arrays_equal_keras_own_array_path(batch_size, steps):
    """On TensorFlow the model reads arrays through `keras_vit.data.array_batches` (Keras'
    own pipeline can wait after its last batch); the outputs and metrics equal those of
    `keras.Model`'s array path: the same batches, the last one partial, `steps` obeyed."""
    model = tiny_vit()
    randomise_weights(model, seed=4)
    model.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (70, 32, 32, 3)).astype("float32")
    labels = np.eye(10, dtype="float32")[rng.integers(0, 10, 70)]
    keras_model = super(type(model), model)
    ours = model.predict(images, batch_size=batch_size, steps=steps, verbose=0)
    theirs = keras_model.predict(images, batch_size=batch_size, steps=steps, verbose=0)
    assert ours.shape == theirs.shape == ((32 if steps else 70), 10)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)
    ours = model.evaluate(images, labels, batch_size=batch_size, steps=steps, verbose=0,
                          return_dict=True)
    theirs = keras_model.evaluate(images, labels, batch_size=batch_size, steps=steps,
                                  verbose=0, return_dict=True)
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-6)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="elsewhere fit reads arrays as Keras does")
@pytest.mark.parametrize("validation", ["split", "pair"])
def test_fit_on_arrays_equals_keras_own_array_path(validation):
    """On TensorFlow `fit` reads arrays through `keras_vit.data.array_batches` (Keras' own
    pipeline can wait after its last batch, up to twice a short fit's time); in order
    (`shuffle=False`) the losses, metrics and weights equal those of `keras.Model.fit`'s
    array path on a twin: the same batches, the last one partial, the same validation
    split (the last fifth) or validation pair in its own batch size."""
    rng = np.random.default_rng(2)
    images = rng.uniform(-1, 1, (45, 32, 32, 3)).astype("float32")
    labels = rng.integers(0, 10, 45)
    if validation == "split":
        arguments = dict(validation_split=0.2)
    else:
        arguments = dict(validation_data=(images[:7], labels[:7]), validation_batch_size=4)
    models = []
    for _ in range(2):
        model = tiny_vit()
        randomise_weights(model, seed=6)
        # Without XLA, which would compile each side's steps for each batch size: the
        # batches, not the compiler, are what this test compares.
        model.compile(optimizer=keras.optimizers.SGD(0.05),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], jit_compile=False)
        models.append(model)
    ours, theirs = models
    fit = dict(batch_size=16, epochs=2, shuffle=False, verbose=0, **arguments)
    ours_history = ours.fit(images, labels, **fit).history
    theirs_history = keras.Model.fit(theirs, images, labels, **fit).history
    assert ours_history.keys() == theirs_history.keys() >= {"loss", "val_loss", "val_accuracy"}
    for name in ours_history:
        np.testing.assert_allclose(ours_history[name], theirs_history[name], rtol=1e-5)
    for a, b in zip(ours.get_weights(), theirs.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.distribute is TensorFlow's")
def test_predict_and_evaluate_under_a_strategy_equal_those_without_one():
    """A model built under a `tf.distribute` strategy reads arrays as one tensor that the
    strategy can shard by example; without one they are sliced a batch at a time
    (`keras_vit.data.array_batches`). Both give the same outputs and metrics."""
    import tensorflow as tf

    plain = tiny_vit()
    randomise_weights(plain, seed=5)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    plain.compile(loss=loss, metrics=["accuracy"])
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        distributed = tiny_vit()
        distributed.compile(loss=loss, metrics=["accuracy"])
    distributed.set_weights(plain.get_weights())
    rng = np.random.default_rng(1)
    images = rng.uniform(-1, 1, (37, 32, 32, 3)).astype("float32")
    labels = rng.integers(0, 10, 37)
    np.testing.assert_allclose(
        distributed.predict(images, batch_size=8, verbose=0),
        plain.predict(images, batch_size=8, verbose=0), rtol=0, atol=1e-6,
    )
    np.testing.assert_allclose(
        distributed.evaluate(images, labels, batch_size=8, verbose=0),
        plain.evaluate(images, labels, batch_size=8, verbose=0), rtol=1e-6,
    )


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


def test_remat_is_recorded_only_when_set_and_survives_the_keras_file(tmp_path):
    """`remat=True` rematerialises every block (Keras' RematScope naming them), is kept by
    the config and the `.keras` file; a model without it has the config it had before."""
    assert "remat" not in tiny_vit().get_config()
    model = tiny_vit(remat=True)
    assert model.get_config()["remat"] is True
    blocks = [layer for layer in model.layers if layer.name.startswith("encoderblock_")]
    assert [b._remat_mode.layer_names for b in blocks] == [[b.name for b in blocks]] * 2
    randomise_weights(model, seed=0)
    x = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    assert_keras_file_round_trip(model, x, tmp_path / "remat.keras")
    assert keras.saving.load_model(tmp_path / "remat.keras").get_config()["remat"] is True


@keras.saving.register_keras_serializable(package="test_model")
class TiltedRope(keras.layers.Layer):
    """A rotary embedding of the test's own: patch `(row, col)` turns every channel pair
    by `tilt * (row + 2 * col)`; the prefix tokens are not turned (sine 0, cosine 1)."""

    def __init__(self, head_dim, grid_size, num_prefix_tokens, tilt=1.0, **kwargs):
        super().__init__(**kwargs)
        self.head_dim, self.grid_size = head_dim, tuple(grid_size)
        self.num_prefix_tokens, self.tilt = num_prefix_tokens, tilt

    def call(self, patches):
        rows, cols = self.grid_size
        angles = np.add.outer(np.arange(rows), 2 * np.arange(cols)).reshape(-1, 1) * self.tilt
        angles = np.concatenate([np.zeros((self.num_prefix_tokens, 1)), angles])
        angles = np.repeat(angles, self.head_dim, axis=1)
        return keras.ops.convert_to_tensor(
            np.concatenate([np.sin(angles), np.cos(angles)], axis=1), "float32"
        )

    def compute_output_spec(self, patches):
        tokens = self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]
        return keras.KerasTensor((tokens, 2 * self.head_dim), "float32")

    def get_config(self):
        return {**super().get_config(), "head_dim": self.head_dim, "grid_size": self.grid_size,
                "num_prefix_tokens": self.num_prefix_tokens, "tilt": self.tilt}


def test_a_rope_layer_config_builds_the_layer_it_names_and_round_trips(tmp_path):
    """`rope=<layer config>`: the model makes that layer for its heads, grid and class
    token; a table of no turns gives the outputs of the same weights without rope, a
    tilted one others; the config keeps the layer's config, and a `.keras` file loads."""
    spec = keras.saving.serialize_keras_object(TiltedRope(1, (1, 1), 0, tilt=0.5))
    model = tiny_vit(rope=spec)
    rope = keras_vit.vit_parts(model).rope
    assert isinstance(rope, TiltedRope) and rope.name == "rope"
    assert (rope.head_dim, rope.grid_size, rope.num_prefix_tokens, rope.tilt) == (8, (4, 4), 1, 0.5)
    assert model.get_config()["rope"] == spec
    randomise_weights(model, 0)
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    plain = tiny_vit()
    plain.set_weights(model.get_weights())
    unturned = tiny_vit(rope=dict(spec, config=dict(spec["config"], tilt=0.0)))
    unturned.set_weights(model.get_weights())
    outputs = [keras.ops.convert_to_numpy(m(images)) for m in (model, plain, unturned)]
    np.testing.assert_allclose(outputs[2], outputs[1], rtol=1e-5, atol=1e-6)
    assert np.abs(outputs[0] - outputs[1]).max() > 1e-3
    rebuilt = keras_vit.VisionTransformer.from_config(model.get_config())
    rebuilt.set_weights(model.get_weights())
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(rebuilt(images)), outputs[0])
    assert_keras_file_round_trip(model, images, tmp_path / "tilted.keras")


@pytest.mark.parametrize("rope, message", [
    ({"config": {}}, r"rope must be True, False or a rotary embedding layer's config"),
    ({"class_name": "NoSuchRope", "config": {}}, "NoSuchRope"),
])
def test_a_bad_rope_config_is_named(rope, message):
    with pytest.raises((ValueError, TypeError), match=message):
        tiny_vit(rope=rope)
