"""Exports are safe to use and to write: every format refuses input of another shape
than the model's (not read as other images), and an export killed while it is written
leaves the previous export loadable."""

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.export.onnx import export_onnx
from keras_vit.export.saved_model import export_saved_model
from keras_vit.export.tflite import export_tflite, run_tflite

onnxruntime = pytest.importorskip("onnxruntime")

# A (1, 16, 16, 3) batch holds as many numbers as three (16, 16, 1) images: a file that
# does not check the shape returns three rows for it (the case as found).
WRONG_SHAPES = [(1, 16, 16, 3), (1, 8, 32, 1)]


def grey_model():
    return keras_vit.ViT(image_size=16, patch_size=8, hidden_dim=16, num_layers=1,
                         num_heads=2, mlp_dim=32, num_classes=4, channels=1)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exports")
    model = grey_model()
    paths = dict(
        tflite=folder / "float.tflite", int8=folder / "int8.tflite",
        onnx=folder / "model.onnx", saved_model=folder / "saved_model",
    )
    export_tflite(model, paths["tflite"])
    export_tflite(model, paths["int8"], quantize="dynamic-int8")
    export_onnx(model, paths["onnx"])
    export_saved_model(model, paths["saved_model"])
    return paths


@pytest.mark.parametrize("shape", WRONG_SHAPES)
@pytest.mark.parametrize("kind", ["tflite", "int8"])
def test_litert_refuses_images_of_another_shape(exports, kind, shape):
    assert run_tflite(exports[kind], np.zeros((2, 16, 16, 1), "float32")).shape == (2, 4)
    with pytest.raises(ValueError, match=rf"takes images of shape \('batch', 16, 16, 1\), "
                                         rf"got \({shape[0]}, {shape[1]}, {shape[2]}, {shape[3]}\)"):
        run_tflite(exports[kind], np.zeros(shape, "float32"))


@pytest.mark.parametrize("shape", WRONG_SHAPES)
def test_onnx_refuses_images_of_another_shape(exports, shape):
    session = onnxruntime.InferenceSession(str(exports["onnx"]),
                                           providers=["CPUExecutionProvider"])
    assert session.run(None, {"images": np.zeros((2, 16, 16, 1), "float32")})[0].shape == (2, 4)
    with pytest.raises(Exception, match="Got invalid dimensions for input: images"):
        session.run(None, {"images": np.zeros(shape, "float32")})


@pytest.mark.parametrize("shape", WRONG_SHAPES)
def test_saved_model_logits_signature_refuses_pixels_of_another_shape(exports, shape):
    logits = tf.saved_model.load(str(exports["saved_model"])).signatures["logits"]
    assert logits(images=tf.zeros((2, 16, 16, 1)))["logits"].shape == (2, 4)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"pixels must have 1 channels .* and height and width 16, 16"):
        logits(images=tf.zeros(shape))


def test_saved_model_serving_signature_refuses_another_channel_count(exports):
    served = tf.saved_model.load(str(exports["saved_model"])).signatures["serving_default"]
    assert served(images=tf.zeros((2, 20, 24, 1), tf.uint8))["probabilities"].shape == (2, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="images must have 1 channels"):
        served(images=tf.zeros((1, 16, 16, 3), tf.uint8))
