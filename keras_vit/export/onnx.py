"""ONNX export from any backend: float pixels in [-1, 1] at the model's size in, outputs out.

TensorFlow and JAX models go through Keras' own `model.export(format="onnx")`
(tf2onnx, jax2onnx). Under PyTorch, Keras' exporter traces a variable batch size with
TorchScript, which cannot follow Keras' own LayerNormalization (its normalised
shape is read from the traced input); this module exports those models with
`torch.onnx.export(dynamo=True)` and a symbolic batch dimension instead. Either way
the layers trace under `keras_vit.models.layers.tracing_for_export()`, and the file
carries the eval preprocessing in its metadata (key `keras_vit`).
"""

import json
import os

import keras
import numpy as np

from keras_vit import __version__
from keras_vit.models.layers import tracing_for_export

INPUT_NAME = "images"
METADATA_KEY = "keras_vit"
# Peak absolute difference `check_onnx` accepts, relative to the largest output.
TOLERANCE = 1e-4


def image_input_size(model, what):
    """`(height, width, channels)` of a model's one fixed-size NHWC image input.

    Args:
        model: a `keras.Model` built by `keras_vit.ViT`.
        what: the export's name, for the error message.

    Example:

    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=3)
    >>> image_input_size(model, "ONNX export")
    (32, 32, 3)
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"{what} needs a keras.Model, got {type(model).__name__}.")
    shape = tuple(model.inputs[0].shape) if len(model.inputs) == 1 else None
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[1:]):
        shapes = [tuple(x.shape) for x in model.inputs]
        raise ValueError(
            f"{what} needs a model with one image input of fixed size "
            f"(batch, height, width, channels), got input shapes {shapes}."
        )
    return shape[1:]


def preprocessing_description(crop_fraction):
    """How a client turns an image into the exported model's input, in words."""
    resize = (
        "bilinear resize of the whole image to image_size" if crop_fraction is None
        else f"bilinear resize of the short side to image_size / {crop_fraction}, "
        "central image_size crop"
    )
    return (
        f"{resize} (keras_vit.data.pipelines.eval_resize), then float32 (x - 127.5) / 127.5, "
        "i.e. pixels in [-1, 1], NHWC"
    )


def _export_torch(model, path, opset, height, width, channels):
    import torch

    model.eval()
    batch = torch.export.Dim("batch")
    # A Keras model's forward takes *args, hence the tuple around the image's shapes.
    program = torch.onnx.export(
        model,
        (torch.zeros((2, height, width, channels)),),
        dynamo=True,
        dynamic_shapes=(({0: batch},),),
        input_names=[INPUT_NAME],
        opset_version=opset,
        verbose=False,
    )
    program.optimize()
    program.save(path)


def export_onnx(model, path, *, opset=None, crop_fraction=None, labels=None, metadata=None):
    """Writes a model as an ONNX file with a variable batch size.

    The input `images` is float32 `(batch, height, width, channels)` at the model's
    size, scaled to [-1, 1] as `keras_vit.preprocess` does; the output is what the
    model returns (logits, or features with `include_top=False`). The file's
    metadata property `keras_vit` holds a JSON record of the input size, the eval
    preprocessing a client must apply, the labels and `metadata`.

    Args:
        model: a model built by `keras_vit.ViT` under any backend, float32.
        path: the `.onnx` file to write.
        opset: ONNX opset version; None takes the exporter's default.
        crop_fraction: the eval crop the preprocessing record states (None: the
            whole image is resized, as the official checkpoints were evaluated).
        labels: optional class names, in class-index order, stored in the record.
        metadata: optional JSON-serialisable dict stored in the record.

    Returns:
        The record stored in the file.

    Example:

    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=3)
    >>> record = export_onnx(model, "/tmp/vit.onnx")
    >>> record["input"]["shape"]
    ['batch', 32, 32, 3]
    """
    import onnx

    height, width, channels = image_input_size(model, "ONNX export")
    policy = keras.backend.standardize_dtype(model.compute_dtype)
    if policy != "float32":
        raise ValueError(
            f"ONNX export needs a float32 model, got compute dtype {policy!r}: rebuild it "
            "under keras.config.set_dtype_policy('float32') and load its weights."
        )
    record = {
        "keras_vit_version": __version__,
        "keras_version": keras.__version__,
        "backend": keras.backend.backend(),
        "input": {
            "name": INPUT_NAME, "dtype": "float32", "shape": ["batch", height, width, channels],
        },
        "output_shape": ["batch", *model.outputs[0].shape[1:]],
        "preprocessing": preprocessing_description(crop_fraction),
        "crop_fraction": crop_fraction,
        "labels": None if labels is None else [str(label) for label in labels],
        "metadata": metadata,
    }
    try:
        record_json = json.dumps(record)
    except TypeError as error:
        raise ValueError(f"metadata must be JSON-serialisable, got {metadata!r}: {error}.") from error
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with tracing_for_export():
        if keras.backend.backend() == "torch":
            _export_torch(model, path, opset, height, width, channels)
        else:
            spec = keras.InputSpec(shape=(None, height, width, channels), dtype="float32",
                                   name=INPUT_NAME)
            model.export(path, format="onnx", verbose=False, input_signature=[spec],
                         opset_version=opset)
    proto = onnx.load(path)
    del proto.metadata_props[:]
    entry = proto.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, record_json
    onnx.save(proto, path)
    return record


def read_onnx_record(path):
    """The `keras_vit` record `export_onnx` stored in an ONNX file (None if absent)."""
    import onnx

    proto = onnx.load(os.fspath(path), load_external_data=False)
    for entry in proto.metadata_props:
        if entry.key == METADATA_KEY:
            return json.loads(entry.value)
    return None


def check_onnx(model, path, batch_size=3, seed=0):
    """Runs an ONNX file with onnxruntime and the model with Keras on the same images.

    Args:
        model: the Keras model the file was exported from.
        path: the `.onnx` file.
        batch_size: images in the batch (export traces other sizes, so this checks
            the variable batch dimension too).
        seed: seed of the uniform [-1, 1] test images.

    Returns:
        The largest absolute difference between the two outputs. Raises a
        `ValueError` naming it when it exceeds `TOLERANCE` times the largest output.
    """
    import onnxruntime

    height, width, channels = image_input_size(model, "check_onnx")
    images = np.random.default_rng(seed).uniform(-1, 1, (batch_size, height, width, channels))
    images = images.astype("float32")
    session = onnxruntime.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    served = session.run(None, {session.get_inputs()[0].name: images})[0]
    expected = keras.ops.convert_to_numpy(model(images, training=False))
    difference = float(np.max(np.abs(served - expected)))
    bound = TOLERANCE * max(1.0, float(np.max(np.abs(expected))))
    if difference > bound:
        raise ValueError(
            f"onnxruntime's outputs differ from Keras' by up to {difference:.3g} (more than "
            f"{bound:.3g}) in {path}: the export is wrong; please report it with the model config."
        )
    return difference
