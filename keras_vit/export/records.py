"""What every export records (its input's size, the eval preprocessing), and telling an
earlier keras-vit export, which a new one may replace, from anything else."""

import json
import os

import keras
import numpy as np

from keras_vit import __version__
from keras_vit.models.preprocessing import DEFAULT, describe, model_preprocessing, resize_name
from keras_vit.utils.extras import optional_import

# The metadata key under which an ONNX export holds its record.
METADATA_KEY = "keras_vit"
# Peak absolute difference between a float export and Keras that `compare_with_keras`
# accepts, relative to the largest output (at least 1).
TOLERANCE = 1e-4
# The record `export_saved_model` writes in its folder: `assets.extra/` is the
# SavedModel folder for files that serving systems carry along but never load into the
# graph (TensorFlow Serving's convention).
SAVED_MODEL_RECORD = os.path.join("assets.extra", "keras_vit.json")
# All that a SavedModel export holds (Keras' `ExportArchive.write_out`, and the record).
SAVED_MODEL_ENTRIES = {"saved_model.pb", "fingerprint.pb", "variables", "assets", "assets.extra"}


def image_input_size(model, what):
    """`(height, width, channels)` of a model's one fixed-size NHWC image input.

    Args:
        model: a `keras.Model` built by `keras_vit.ViT`.
        what: the export's name, for the error message.

    Example:

    >>> import keras_vit
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


def export_record(model, what, input_name, *, crop_fraction=None, labels=None, metadata=None):
    """The JSON-serialisable record of a float-pixel export: input, preprocessing, labels.

    The exported model takes float32 `(batch, height, width, channels)` pixels
    normalised as its weights expect (`model_preprocessing`: scaled to [-1, 1] for the
    official ViTs, ImageNet's mean and std for DeiT) at the model's size;
    `preprocessing` says how a client gets them from an image, as the run's evaluation
    did, and `preprocessing_config` gives its mean, std, interpolation and crop.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=3)
    >>> export_record(model, "ONNX export", "images")["input"]["shape"]
    ['batch', 32, 32, 3]
    """
    height, width, channels = image_input_size(model, what)
    preprocessing = model_preprocessing(model)
    method = resize_name(preprocessing)
    resize = (
        f"{method} resize of the whole image to image_size" if crop_fraction is None
        else f"{method} resize of the short side to image_size / {crop_fraction}, "
        "central image_size crop"
    )
    scaled = ", i.e. pixels in [-1, 1]" if preprocessing == DEFAULT else ""
    record = {
        "keras_vit_version": __version__,
        "keras_version": keras.__version__,
        "backend": keras.backend.backend(),
        "input": {
            "name": input_name, "dtype": "float32", "shape": ["batch", height, width, channels],
        },
        "output_shape": ["batch", *model.outputs[0].shape[1:]],
        "preprocessing": f"{resize} (keras_vit.data.pipelines.eval_resize), then float32 "
        f"{describe(preprocessing)}{scaled}, NHWC",
        "preprocessing_config": preprocessing,
        "crop_fraction": crop_fraction,
        "labels": None if labels is None else [str(label) for label in labels],
        "metadata": metadata,
    }
    try:
        json.dumps(record)
    except TypeError as error:
        raise ValueError(f"metadata must be JSON-serialisable, got {metadata!r}: {error}.") from error
    return record


def compare_with_keras(model, run, runtime, *, batch_size=3, seed=0, tolerance=TOLERANCE):
    """The largest absolute difference between an exported file's outputs and Keras'.

    Args:
        model: the Keras model the file was exported from.
        run: runs the file: float32 images `(batch, height, width, channels)` to outputs.
        runtime: the runtime's name, for the error message.
        batch_size: images in the batch (the exports trace other sizes, so this checks
            the variable batch dimension too).
        seed: seed of the uniform [-1, 1] test images.
        tolerance: raise a `ValueError` naming the difference when it exceeds this
            times the largest output (at least 1); None never raises.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=3)
    >>> compare_with_keras(model, lambda x: model.predict(x, verbose=0), "Keras")
    0.0
    """
    shape = (batch_size, *image_input_size(model, "compare_with_keras"))
    images = np.random.default_rng(seed).uniform(-1, 1, shape).astype("float32")
    served = np.asarray(run(images))
    expected = keras.ops.convert_to_numpy(model(images, training=False))
    difference = float(np.max(np.abs(served - expected)))
    bound = None if tolerance is None else tolerance * max(1.0, float(np.max(np.abs(expected))))
    if bound is not None and difference > bound:
        raise ValueError(
            f"{runtime}'s outputs differ from Keras' by up to {difference:.3g} (more than "
            f"{bound:.3g}): the export is wrong; please report it with the model config."
        )
    return difference


def _record(path):
    """The keras-vit record in JSON file `path`, or None if it is none."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "keras_vit_version" in record else None


def read_onnx_record(path):
    """The `keras_vit` record `export_onnx` stored in an ONNX file (None if absent)."""
    onnx = optional_import("onnx", "Reading an ONNX file")

    proto = onnx.load(os.fspath(path), load_external_data=False)
    for entry in proto.metadata_props:
        if entry.key == METADATA_KEY:
            return json.loads(entry.value)
    return None


def is_export(path, format):
    """Whether `path` holds a keras-vit export in `format` ("saved_model", "onnx" or
    "tflite") and nothing else: what an export in that format may replace.

    A SavedModel folder holds only what `export_saved_model` writes, its record among
    it; an ONNX file holds its record (`read_onnx_record`); a `.tflite` file has its
    record beside it (`<file>.json`).

    Example:

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> is_export(folder, "saved_model")
    False
    >>> os.makedirs(os.path.join(folder, "assets.extra"))
    >>> with open(os.path.join(folder, SAVED_MODEL_RECORD), "w") as f:
    ...     _ = f.write('{"keras_vit_version": "1.0"}')
    >>> is_export(folder, "saved_model")
    True
    """
    if format == "saved_model":
        return (
            _record(os.path.join(path, SAVED_MODEL_RECORD)) is not None
            and set(os.listdir(path)) <= SAVED_MODEL_ENTRIES
            and os.listdir(os.path.dirname(os.path.join(path, SAVED_MODEL_RECORD)))
            == [os.path.basename(SAVED_MODEL_RECORD)]
        )
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        start = f.read(8)
    if format == "tflite":  # a FlatBuffer with LiteRT's file identifier
        return start[4:8] == b"TFL3" and _record(path + ".json") is not None
    # A serialised ONNX model starts with its field 1, ir_version: not worth parsing else.
    if not start.startswith(b"\x08"):
        return False
    try:
        return read_onnx_record(path) is not None
    except ImportError:
        raise
    except Exception:  # noqa: BLE001 - whatever does not parse as ONNX is no ONNX export
        return False


def _within(folder, path):
    """Whether `path` is `folder` or lies inside it (both resolved by `os.path.realpath`)."""
    return os.path.commonpath([folder, path]) == folder


def check_export_target(path, format, *, source=None, overwrite=False):
    """Raises a `ValueError` saying why, unless an export in `format` may be written at
    `path`.

    An export replaces only its own kind of output: `path` must be new, an empty folder
    (`saved_model`), or an earlier keras-vit export in `format` (`is_export`).
    `overwrite` allows any other folder (`saved_model`) or file (`onnx`, `tflite`),
    except one inside the folder `source` (a run folder) or holding `source` (the model
    exported: `path` is never replaced by what is exported from inside it). Paths are
    compared as `os.path.realpath` resolves them, so symbolic links and `..` do not
    hide either; URLs (`gs://`) are not checked.

    Args:
        path: where the export goes (`--out`).
        format: `"saved_model"` (a folder), `"onnx"` or `"tflite"` (a file).
        source: the `--from` argument, where it is a local file or folder.
        overwrite: replace a folder or file that is not an export (`--overwrite`).

    Example:

    >>> import tempfile
    >>> run = tempfile.mkdtemp()
    >>> check_export_target(os.path.join(run, ".."), "saved_model", source=run)
    Traceback (most recent call last):
    ...
    ValueError: --out ... holds what it exports (--from ...): the export would replace it; pass another --out.
    """
    if "://" in str(path):
        return
    path = os.fspath(path)
    where, is_folder = os.path.realpath(path), format == "saved_model"
    local_source = source is not None and "://" not in str(source) and os.path.exists(source)
    origin = os.path.realpath(source) if local_source else None
    if origin is not None and _within(where, origin):
        raise ValueError(
            f"--out {path} holds what it exports (--from {source}): the export would "
            "replace it; pass another --out."
        )
    if not os.path.lexists(where) or is_export(where, format):
        return
    if os.path.isdir(where) != is_folder:
        kind = "a folder" if is_folder else "a file"
        raise ValueError(
            f"--out {path} is {'a file' if is_folder else 'a folder'}, but --format {format} "
            f"writes {kind}: pass another --out."
        )
    if is_folder and not os.listdir(where):
        return  # an empty folder: nothing to lose
    if origin is not None and os.path.isdir(origin) and _within(origin, where):
        raise ValueError(
            f"--out {path} is inside {source}, which it exports from, and is not an earlier "
            f"keras-vit export: the export would replace it; pass another --out."
        )
    if overwrite:
        return
    if is_folder:
        # What an export would not have written first (the user's notes in an export).
        entries = sorted(set(os.listdir(where)) - SAVED_MODEL_ENTRIES) or sorted(os.listdir(where))
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise ValueError(
            f"--out {path} holds files that are not a keras-vit export ({shown}): the "
            "export would replace the folder; pass another --out, or --overwrite "
            "(overwrite=True) to replace it."
        )
    raise ValueError(
        f"--out {path} is not a keras-vit export (a {format} file with its record): the "
        "export would replace it; pass another --out, or --overwrite (overwrite=True) to "
        "replace it."
    )
