"""ONNX export on every backend, checked with onnxruntime against the Keras model.

Every backend exports through Keras' own `model.export(format="onnx")` with a variable
batch size; the file is run at batch sizes 3 and 1 (Keras' PyTorch exporter traces batch
1, the others a symbolic batch). This file imports no TensorFlow, so it reruns unchanged
under JAX and PyTorch (the slow tests at the end).
"""

import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from helpers import randomise_weights, tiny_vit
from keras_vit.export.onnx import check_onnx, export_onnx, read_onnx_record
from keras_vit.export.records import TOLERANCE
from keras_vit.backend.export import is_tracing_for_export, tracing_for_export
from keras_vit.layers.normalization import LayerNormalization

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")
ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "plain": dict(),
    # A ResNet root and one stage in front of the patch embedding (the root's max-pool
    # is what jax2onnx exported in a form onnxruntime refused).
    "hybrid": dict(image_size=64, patch_size=1, resnet_stages=(1,)),
    "features": dict(include_top=False),
}


def _served(path, images):
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (name,) = [x.name for x in session.get_inputs()]
    return session.run(None, {name: images})[0]


def _export_and_compare(kind, tmp_path):
    model = tiny_vit(**MODELS[kind])
    randomise_weights(model, seed=1)
    path = tmp_path / f"{kind}.onnx"
    record = export_onnx(model, path, crop_fraction=0.875, metadata={"run": "test"})
    assert not is_tracing_for_export()
    (source,) = onnx.load(str(path)).graph.input
    assert source.name == "images"
    assert source.type.tensor_type.shape.dim[0].dim_param  # a symbolic batch size
    size = model.input_shape[1]
    rng = np.random.default_rng(2)
    for batch in (3, 1):
        images = rng.uniform(-1, 1, (batch, size, size, 3)).astype("float32")
        expected = keras.ops.convert_to_numpy(model(images, training=False))
        served = _served(path, images)
        assert served.shape == expected.shape
        assert np.abs(expected).max() > 0.1  # outputs that a wrong graph would change
        np.testing.assert_allclose(served, expected, rtol=0, atol=TOLERANCE)
    assert read_onnx_record(path) == record
    assert record["input"]["shape"] == ["batch", size, size, 3]
    assert record["metadata"] == {"run": "test"}
    assert "central image_size crop" in record["preprocessing"]
    return model, path


def test_onnx_plain_model_matches_keras(tmp_path):
    model, path = _export_and_compare("plain", tmp_path)
    assert check_onnx(model, path, batch_size=5) <= TOLERANCE


def test_onnx_plain_model_exports_with_keras_alone(tmp_path):
    # Keras' own export, called as Keras documents it (no tracing_for_export()).
    model = tiny_vit()
    randomise_weights(model, seed=1)
    path = tmp_path / "keras.onnx"
    spec = keras.InputSpec(shape=(None, 32, 32, 3), dtype="float32")
    model.export(str(path), format="onnx", verbose=False, input_signature=[spec])
    images = np.random.default_rng(3).uniform(-1, 1, (3, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(_served(path, images), keras.ops.convert_to_numpy(model(images)),
                               rtol=0, atol=TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hybrid", "features"])
def test_onnx_matches_keras(kind, tmp_path):
    _export_and_compare(kind, tmp_path)


@pytest.mark.parametrize(
    "axis, scale, center", [(-1, True, True), ((1, 2), True, False), (1, False, True)]
)
def test_layer_norm_export_form_is_the_closed_form(axis, scale, center):
    # The form LayerNormalization traces for exporters, against numpy's normalisation. (Its
    # docstring compares it with Keras' own form over the last axis; over middle axes
    # Keras 3.15 on PyTorch hands torch's layer_norm the wrong normalised shape.)
    rng = np.random.default_rng(5)
    x = rng.normal(2.0, 3.0, (2, 3, 4, 5)).astype("float32")
    norm = LayerNormalization(axis=axis, epsilon=1e-6, scale=scale, center=center)
    norm.build(x.shape)
    for weight in norm.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))
    axes = tuple(np.atleast_1d(axis))
    broadcast = [1, 1, 1, 1]
    for a in axes:
        broadcast[a] = x.shape[a]
    expected = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + 1e-6)
    if scale:
        expected = expected * keras.ops.convert_to_numpy(norm.gamma).reshape(broadcast)
    if center:
        expected = expected + keras.ops.convert_to_numpy(norm.beta).reshape(broadcast)
    with tracing_for_export():
        traced = keras.ops.convert_to_numpy(norm(x))
    np.testing.assert_allclose(traced, expected, rtol=0, atol=1e-5)


def test_check_onnx_names_a_wrong_export(tmp_path):
    model = tiny_vit()
    randomise_weights(model, seed=1)
    path = tmp_path / "model.onnx"
    export_onnx(model, path)
    other = tiny_vit()
    randomise_weights(other, seed=2)
    with pytest.raises(ValueError, match="onnxruntime's outputs differ from Keras'"):
        check_onnx(other, path)


def test_onnx_export_refuses_a_half_precision_model(tmp_path):
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = tiny_vit()
    with pytest.raises(ValueError, match="needs a float32 model, got compute dtype 'bfloat16'"):
        export_onnx(model, tmp_path / "model.onnx")


@pytest.mark.slow
@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="starts the other backends")
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_onnx_export_on_backend(backend):
    env = {**os.environ, "KERAS_BACKEND": backend}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-k", "onnx_plain or hybrid", "tests/test_export_formats.py"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    print(result.stdout[-3000:])
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
    assert "3 passed" in result.stdout


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the CLI trains on TensorFlow")
def test_cli_exports_onnx_from_a_keras_file(tmp_path, capsys):
    from keras_vit import cli

    model = tiny_vit()
    randomise_weights(model, seed=3)
    model.save(tmp_path / "model.keras")
    out = tmp_path / "served" / "vit.onnx"
    assert cli.main(["export", "--from", str(tmp_path / "model.keras"), "--format", "onnx",
                     "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Checked with onnxruntime against Keras" in printed
    assert "(x - 127.5) / 127.5, i.e. pixels in [-1, 1]" in printed
    images = np.random.default_rng(4).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(_served(out, images), keras.ops.convert_to_numpy(model(images)),
                               rtol=0, atol=TOLERANCE)
    record = read_onnx_record(out)
    assert record["crop_fraction"] is None and record["metadata"]["train_config"] is None

    assert cli.main(["export", "--from", str(tmp_path / "model.keras"), "--format", "onnx",
                     "--out", str(out), "--quantize", "dynamic-int8"]) == 2
    assert "--quantize dynamic-int8 applies to --format tflite only" in capsys.readouterr().err
