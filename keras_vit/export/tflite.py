"""LiteRT (TFLite) export: float pixels normalised as the weights expect in, outputs out.

The pixels are at the model's size, normalised as `keras_vit.preprocess(images,
model_preprocessing(model))` does: [-1, 1] for the official ViTs, ImageNet's mean and
std for DeiT; the file's record states it.

TensorFlow-only: Keras' `model.export(format="litert")` converts the model with
TensorFlow's LiteRT converter. `quantize="dynamic-int8"` stores the kernels of the
matrix products as int8, per output channel (the converter's dynamic-range
quantization: activations stay float and are quantized on the fly); kernels of fewer
than 1024 elements, the position table, norms and biases stay float32. The record of `keras_vit.export.records` is
written beside the file as `<file>.json`.

The file's input is `(-1, height, width, channels)`, but the LiteRT interpreter does not
check the shape a client resizes it to: `resize_tensor_input(index, shape)` of a
`(1, 16, 16, 3)` batch on a 1-channel model reads the buffer as three grey images and
returns three rows. Resize with `strict=True` (the interpreter then refuses any change
but the batch size), as `run_tflite` does.
"""

import json
import os

import keras
import numpy as np
import tensorflow as tf

from keras_vit.export.records import (
    TOLERANCE,
    check_export_target,
    compare_with_keras,
    export_record,
    image_input_size,
)
from keras_vit.backend.export import tracing_for_export
from keras_vit.models.naflex_mode import is_naflex
from keras_vit.utils.files import atomic_path, atomic_write

INPUT_NAME = "images"
QUANTIZATIONS = (None, "dynamic-int8")


def export_tflite(
    model, path, *, quantize=None, crop_fraction=None, labels=None, metadata=None,
    overwrite=False,
):
    """Writes a float32 model as a LiteRT (`.tflite`) file with a variable batch size.

    Args:
        model: a float32 model built by `keras_vit.ViT` under the TensorFlow backend.
        path: the `.tflite` file to write; the record goes to `path + ".json"`.
        quantize: None (float32 weights) or `"dynamic-int8"` (int8 weights).
        crop_fraction, labels, metadata: stored in the record, as `export_onnx` does.
        overwrite: replace a file at `path` that is not a keras-vit LiteRT export
            (`keras_vit.export.records.check_export_target`).

    Returns:
        The record written beside the file.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=3)
    >>> record = export_tflite(model, "/tmp/vit.tflite", quantize="dynamic-int8")
    >>> record["quantize"]
    'dynamic-int8'
    """
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            f"LiteRT export needs the TensorFlow backend, but Keras runs on "
            f"{keras.backend.backend()!r}: save the model (model.save('model.keras')) and "
            "export it from a process started with KERAS_BACKEND=tensorflow."
        )
    if is_naflex(model):
        raise ValueError(
            f"LiteRT export refuses NaFlex model {model.name!r}: its varying token count "
            "converts only to TensorFlow ops (FlexStridedSlice) that the LiteRT interpreter "
            "does not run; export it with --format saved_model or onnx."
        )
    check_export_target(path, "tflite", overwrite=overwrite)
    if quantize not in QUANTIZATIONS:
        raise ValueError(
            f"Unknown quantize {quantize!r}: expected None (float32) or 'dynamic-int8'."
        )
    record = export_record(
        model, "LiteRT export", INPUT_NAME, crop_fraction=crop_fraction, labels=labels,
        metadata=metadata,
    )
    if any(layer.quantization_mode for layer in model._flatten_layers()):
        raise ValueError(
            f"Model {model.name!r} is quantized with model.quantize(): LiteRT takes no int8 "
            "activations from Keras; export the float model with quantize='dynamic-int8'."
        )
    record["quantize"] = quantize
    height, width, channels = image_input_size(model, "LiteRT export")
    spec = keras.InputSpec(shape=(None, height, width, channels), dtype="float32",
                           name=INPUT_NAME)
    options = {"optimizations": [tf.lite.Optimize.DEFAULT]} if quantize else {}
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # Each file under a temporary name, renamed into place whole (a kill leaves the old one).
    with atomic_path(path) as temporary:
        with tracing_for_export():
            model.export(temporary, format="litert", verbose=False, input_signature=[spec],
                         **options)
    atomic_write(path + ".json", json.dumps(record, indent=2))
    return record


def run_tflite(path, images):
    """Runs a `.tflite` file on a float32 batch with the LiteRT interpreter.

    The interpreter comes from `ai_edge_litert` where it is installed, else from
    TensorFlow (`tf.lite.Interpreter`). Images of another shape than the file's input
    (batch size aside) are a `ValueError` naming both shapes.

    Example:

    >>> images = np.zeros((2, 32, 32, 3), "float32")
    >>> run_tflite("/tmp/vit.tflite", images).shape
    (2, 3)
    """
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        Interpreter = tf.lite.Interpreter
    interpreter = Interpreter(model_path=os.fspath(path))
    (source,) = interpreter.get_input_details()
    expected = tuple(int(d) for d in source["shape_signature"])
    shape = tuple(np.shape(images))
    if len(shape) != len(expected) or any(e not in (-1, s) for e, s in zip(expected, shape)):
        raise ValueError(
            f"{os.fspath(path)} takes images of shape "
            f"{tuple('batch' if d == -1 else d for d in expected)}, got {shape}: resize the "
            "images to the model's size and channels (see its .json record)."
        )
    # strict: the interpreter itself refuses any change but the batch size.
    interpreter.resize_tensor_input(source["index"], shape, strict=True)
    interpreter.allocate_tensors()
    interpreter.set_tensor(source["index"], np.asarray(images, np.float32))
    interpreter.invoke()
    (result,) = interpreter.get_output_details()
    return interpreter.get_tensor(result["index"])


def check_tflite(model, path, quantized=False, batch_size=3, seed=0):
    """Runs a `.tflite` file with the LiteRT interpreter and the model with Keras.

    Returns the largest absolute difference; for a float file (not `quantized`) raises
    a `ValueError` naming it when it exceeds `keras_vit.export.records.TOLERANCE`.
    """
    return compare_with_keras(
        model, lambda images: run_tflite(path, images), "The LiteRT interpreter",
        batch_size=batch_size, seed=seed, tolerance=None if quantized else TOLERANCE,
    )
