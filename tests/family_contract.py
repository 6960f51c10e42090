"""The contract every family's model keeps, checked on a tiny model of its switches (as
keras-hub's `run_backbone_test`): each family's test module calls `check_family_contract`
for each of its configurations, on whichever Keras backend runs it (tests/test_backends_*.py
runs those modules on JAX and PyTorch).

What the contract holds, each part exact unless it says otherwise:
- the config records the switches, `from_config` rebuilds the same config and weight
  paths, and a `.keras` file gives the outputs back;
- `save_npz` weights loaded by `load_pretrained` into a model built from the same
  arguments give the outputs back, with nothing missing, unexpected or mismatched;
- a `dynamic_image_size` model with the same weights gives the same outputs at the
  trained size, and runs at another multiple of the patch;
- under `mixed_bfloat16` the outputs are within 5% of float32's, and logits stay float32;
- the feature maps are the last block's tokens after the prefix tokens (class,
  distillation, registers), and the attention map is the class token's rollout row
  over the patches;
- LoRA keeps the outputs until trained and adds trainable factors.
"""

import logging

import keras
import numpy as np

import keras_vit
from keras_vit.training.lora import enable_lora

TINY = dict(image_size=32, patch_size=8, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=64)
IMAGES = np.random.default_rng(0).uniform(-1, 1, (3, 32, 32, 3)).astype("float32")


def as_numpy(x):
    return keras.ops.convert_to_numpy(x)


def predicted(model, inputs):
    """`model(inputs)` as NumPy. On JAX through Keras' compiled predict step, which
    compiles once for each input shape: eager JAX compiles each op for each new shape, so
    a test that runs one model at many sizes spends its time compiling ops."""
    if keras.backend.backend() == "jax":
        return model.predict_on_batch(inputs)
    return keras.tree.map_structure(as_numpy, model(inputs))


def relative_error(ours, reference):
    """The largest difference, over the largest magnitude of the reference."""
    return max(
        np.abs(a - b).max() / np.abs(b).max() for a, b in zip(ours, reference, strict=True)
    )


def probe(model, final_norm=False):
    """A model of `model`'s input to its output, its final normed tokens where
    `final_norm`, and each block's output tokens."""
    parts = keras_vit.vit_parts(model)
    norm = [parts.norm.output] if final_norm else []
    return keras.Model(model.input, [model.output, *norm, *(b.output for b in parts.blocks)])


def outputs(model, images=IMAGES, final_norm=False):
    """`probe(model, final_norm)`'s outputs on `images`, as NumPy."""
    return [as_numpy(x) for x in probe(model, final_norm)(images)]


def randomised(seed=1, **arguments):
    """A tiny ViT of `arguments` with non-default weights, so a misplaced tensor shows."""
    model = keras_vit.ViT(**{**TINY, **arguments})
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(scale=0.2, size=v.shape).astype("float32"))
    return model


def prefix_count(switches):
    """The tokens in front of the patches: class (and distillation) token and registers."""
    if switches.get("classifier", "token") in ("gap", "map"):
        return 0
    return 1 + bool(switches.get("distilled")) + switches.get("num_registers", 0)


def check_family_contract(switches, tmp_path):
    """Checks every part of the module docstring's contract for a tiny model with the
    family `switches` (keyword arguments of `keras_vit.ViT`), writing files under
    `tmp_path`."""
    model = randomised(**switches)
    expected = as_numpy(model(IMAGES))
    _check_config_and_keras_file(model, switches, expected, tmp_path / "model.keras")
    _check_npz(model, switches, expected, tmp_path / "weights.npz")
    _check_dynamic_size(model, switches, expected)
    _check_mixed_precision(model, switches, expected)
    if prefix_count(switches):
        _check_maps(model, switches)
    _check_lora(model, expected)


def _check_config_and_keras_file(model, switches, expected, path):
    config = model.get_config()
    assert {key: config[key] for key in switches} == switches
    rebuilt = keras_vit.VisionTransformer.from_config(config)
    assert rebuilt.get_config() == config
    assert [w.path for w in rebuilt.weights] == [w.path for w in model.weights]
    model.save(path)
    np.testing.assert_array_equal(as_numpy(keras.saving.load_model(path)(IMAGES)), expected)


def _check_npz(model, switches, expected, path):
    keras_vit.save_npz(model, path)
    loaded = keras_vit.ViT(**{**TINY, **switches})
    report = keras_vit.load_pretrained(loaded, path)
    assert not (report.missing or report.unexpected or report.mismatched), report
    np.testing.assert_array_equal(as_numpy(loaded(IMAGES)), expected)


def _check_dynamic_size(model, switches, expected):
    dynamic = keras_vit.ViT(**{**TINY, **switches, "dynamic_image_size": True})
    dynamic.set_weights(model.get_weights())
    np.testing.assert_allclose(as_numpy(dynamic(IMAGES)), expected, rtol=1e-5, atol=1e-5)
    other = as_numpy(dynamic(np.zeros((1, 40, 24, 3), "float32")))
    assert other.shape[0] == 1 and np.isfinite(other).all()


def _check_mixed_precision(model, switches, expected):
    mixed = keras_vit.ViT(**{**TINY, **switches, "dtype": "mixed_bfloat16"})
    mixed.set_weights(model.get_weights())
    outputs = mixed(IMAGES)
    if switches.get("include_top", True):  # logits; a backbone's features stay bfloat16
        assert keras.backend.standardize_dtype(outputs.dtype) == "float32"
    assert relative_error([as_numpy(outputs).astype("float32")], [expected]) < 0.05


def _check_maps(model, switches):
    prefix = prefix_count(switches)
    assert_maps_leave_out_prefix(model, IMAGES, outputs(model)[-1], prefix, prefix)


def assert_maps_leave_out_prefix(model, images, last, prefix, prefix_tokens=None):
    """`feature_model`'s maps are the last block's tokens `last` after the `prefix` tokens
    in front of the patches, and its prefix output those; the attention map (told
    `prefix_tokens`) is the class token's rollout row over the patches. Returns the
    attention weights."""
    count, width = len(images), last.shape[-1]
    maps, tokens = keras_vit.feature_model(model, prefix_tokens=True)(images)
    rows, cols = maps.shape[1:3]
    patches = rows * cols
    assert tuple(maps.shape) == (count, rows, cols, width) and patches == last.shape[1] - prefix
    assert tuple(tokens.shape) == (count, prefix, width)
    np.testing.assert_array_equal(as_numpy(maps).reshape(count, patches, width), last[:, prefix:])
    np.testing.assert_array_equal(as_numpy(tokens), last[:, :prefix])

    _, attentions = keras_vit.attention_model(model)(images)
    rollout = keras_vit.attention_rollout(attentions)
    assert tuple(rollout.shape) == (count, patches + prefix, patches + prefix)
    np.testing.assert_array_equal(
        keras_vit.attention_map(rollout, (rows, cols), prefix_tokens).reshape(count, patches),
        rollout[:, 0, prefix:],
    )
    return attentions


def _check_lora(model, expected):
    before = {v.path for v in model.trainable_weights}
    enable_lora(model, 2)
    np.testing.assert_allclose(as_numpy(model(IMAGES)), expected, atol=1e-5)
    assert {v.path for v in model.trainable_weights} - before


def fine_tune(source, kwargs, image_size, out, caplog):
    """The engine's one-epoch fine-tune of the demo recipe (5 digit classes) on a custom
    architecture `kwargs` (`model.kwargs`) from `source`; its `TrainResult`."""
    from keras_vit import cli
    from keras_vit.training.config import apply_overrides
    from keras_vit.training.engine import train

    config = apply_overrides(cli.load_recipe("demo"), [
        "model.variant=custom", f"model.kwargs={kwargs!r}", f"model.image_size={image_size}",
        "model.channels=3", f"model.init_from={source}", "data.classes=0-4",
        "schedule.epochs=1", "schedule.warmup_updates=2", "checkpointing.tensorboard=False",
        f"out={out}",
    ])
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        return train(config, verbose=0)
