"""ONNX export from any backend: float pixels normalised as the weights expect in, outputs out.

Every backend goes through Keras' own `model.export(format="onnx")`: tf2onnx under
TensorFlow, jax2onnx under JAX, and under PyTorch the TorchScript exporter, which
Keras uses for a variable batch size (it traces batch 1). The layers trace under
`keras_vit.backend.export.tracing_for_export()` (PyTorch's fused layer norm, for one,
does not export with a variable batch), and the file carries the eval preprocessing
in its metadata (key `keras_vit`).
"""

import json
import os
import warnings

import keras

from keras_vit.export.records import (
    METADATA_KEY,
    check_export_target,
    compare_with_keras,
    export_record,
    image_input_size,
    naflex_signature,
    read_onnx_record,  # noqa: F401  (read beside the export: `onnx.read_onnx_record`)
)
from keras_vit.backend.export import tracing_for_export
from keras_vit.models.naflex_mode import is_naflex, naflex_twin
from keras_vit.utils.extras import ONNX_EXPORTERS, optional_import
from keras_vit.utils.files import atomic_path

INPUT_NAME = "images"


def export_onnx(model, path, *, opset=None, crop_fraction=None, labels=None, metadata=None,
                overwrite=False):
    """Writes a model as an ONNX file with a variable batch size.

    The input `images` is float32 `(batch, height, width, channels)` at the model's
    size, normalised as `keras_vit.preprocess(images, model_preprocessing(model))` does
    ([-1, 1] for the official ViTs, ImageNet's mean and std for DeiT); the output is what the
    model returns (logits, or features with `include_top=False`). The file's
    metadata property `keras_vit` holds a JSON record of the input size, the eval
    preprocessing a client must apply, the labels and `metadata`.

    A NaFlex model (`keras_vit.ViT(naflex=True)`) takes, under TensorFlow or PyTorch,
    its three inputs of any batch and token count: `patches` float32 `(batch, tokens,
    P * P * channels)`, `patch_mask` int32 `(batch, tokens)`, `spatial_shapes` int32
    `(batch, 2)`, as `keras_vit.naflex_inputs` makes them; its record says so
    (`naflex`: patch size, token budget, inputs; `keras_vit.export.records.naflex_entry`).

    Args:
        model: a model built by `keras_vit.ViT` under any backend, float32.
        path: the `.onnx` file to write.
        opset: ONNX opset version; None takes the exporter's default.
        crop_fraction: the eval crop the preprocessing record states (None: the
            whole image is resized, as the official checkpoints were evaluated).
        labels: optional class names, in class-index order, stored in the record.
        metadata: optional JSON-serialisable dict stored in the record.
        overwrite: replace a file at `path` that is not a keras-vit ONNX export
            (`keras_vit.export.records.check_export_target`).

    Returns:
        The record stored in the file.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=3)
    >>> record = export_onnx(model, "/tmp/vit.onnx")
    >>> record["input"]["shape"]
    ['batch', 32, 32, 3]
    """
    onnx = optional_import("onnx", "ONNX export")
    optional_import(ONNX_EXPORTERS[keras.backend.backend()], "ONNX export")
    check_export_target(path, "onnx", overwrite=overwrite)
    naflex = is_naflex(model)
    if naflex:  # a packed model (images_per_row) serves one image per row
        model = naflex_twin(model)
    if naflex and keras.backend.backend() == "jax":
        raise ValueError(
            f"ONNX export of NaFlex model {model.name!r} needs the TensorFlow or PyTorch "
            "backend: jax2onnx gives its patch layer no token count to number the tokens "
            "by. Save it (model.save('model.keras')) and export it from a process started "
            "with KERAS_BACKEND=tensorflow."
        )
    record = export_record(
        model, "ONNX export", INPUT_NAME, crop_fraction=crop_fraction, labels=labels,
        metadata=metadata,
    )
    policy = keras.backend.standardize_dtype(model.compute_dtype)
    if policy != "float32":
        raise ValueError(
            f"ONNX export needs a float32 model, got compute dtype {policy!r}: rebuild it "
            "under keras.config.set_dtype_policy('float32') and load its weights."
        )
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if naflex:
        spec = naflex_signature(model)
    else:
        height, width, channels = image_input_size(model, "ONNX export")
        spec = keras.InputSpec(shape=(None, height, width, channels), dtype="float32",
                               name=INPUT_NAME)
    # Written under a temporary name, renamed into place whole (a kill leaves the old file).
    with atomic_path(path) as temporary:
        with tracing_for_export(), warnings.catch_warnings():
            # Keras' tf2onnx path probes `np.object`, which NumPy answers with a warning
            # meant for Keras' developers, not for the user.
            warnings.filterwarnings("ignore", r"In the future `np\.object`", FutureWarning)
            model.export(temporary, format="onnx", verbose=False, input_signature=[spec],
                         opset_version=opset)
        proto = onnx.load(temporary)
        del proto.metadata_props[:]
        entry = proto.metadata_props.add()
        entry.key, entry.value = METADATA_KEY, json.dumps(record)
        onnx.save(proto, temporary)
    return record


def check_onnx(model, path, batch_size=3, seed=0):
    """Runs an ONNX file with onnxruntime and the model with Keras on the same images.

    Returns the largest absolute difference; raises a `ValueError` naming it when it
    exceeds `keras_vit.export.records.TOLERANCE` (see `compare_with_keras`).
    """
    onnxruntime = optional_import("onnxruntime", "Checking an ONNX file")

    session = onnxruntime.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    names = [source.name for source in session.get_inputs()]

    def run(inputs):  # one image batch, or a NaFlex model's inputs by name
        feed = inputs if isinstance(inputs, dict) else {names[0]: inputs}
        return session.run(None, {name: feed[name] for name in names})[0]

    return compare_with_keras(model, run, "onnxruntime", batch_size=batch_size, seed=seed)
