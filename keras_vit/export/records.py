"""What every export records (its input's size, the eval preprocessing), and telling an
earlier keras-vit export, which a new one may replace, from anything else."""

import json
import os

import keras
import numpy as np

from keras_vit import __version__
from keras_vit.data import naflex_inputs
from keras_vit.models.naflex_mode import is_naflex, naflex_budget, naflex_preprocessing
from keras_vit.models.preprocessing import DEFAULT, describe, model_preprocessing, resize_name
from keras_vit.models.vit import vit_parts
from keras_vit.utils.extras import optional_import

# The metadata key under which an ONNX export holds its record.
METADATA_KEY = "keras_vit"
# Peak absolute difference between a float export and Keras that `compare_with_keras`
# accepts, relative to the largest output (at least 1).
TOLERANCE = 1e-4
# The patch grids (rows, cols) of the mixed-size images `compare_with_keras` checks a
# NaFlex export on, in patches; one more pixel than whole patches on odd images.
NAFLEX_CHECK_GRIDS = ((3, 7), (5, 2), (4, 4), (1, 6), (6, 1))
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


def naflex_signature(model):
    """The inputs of a NaFlex model's export, by name: `keras.InputSpec`s of any batch
    and token count (`patch_mask` int32, as `keras_vit.naflex_inputs` makes it).

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, naflex=True)
    >>> {name: spec.shape for name, spec in naflex_signature(model).items()}
    {'patches': (None, None, 192), 'patch_mask': (None, None), 'spatial_shapes': (None, 2)}
    """
    patches = vit_parts(model).patches
    width = patches.patch_size**2 * patches.channels
    return {
        "patches": keras.InputSpec(shape=(None, None, width), dtype="float32", name="patches"),
        "patch_mask": keras.InputSpec(shape=(None, None), dtype="int32", name="patch_mask"),
        "spatial_shapes": keras.InputSpec(shape=(None, 2), dtype="int32", name="spatial_shapes"),
    }


def naflex_entry(model):
    """What the record of a NaFlex model's export tells a client: that the model is
    NaFlex, its patch size, channels and token budget, its inputs, how to make them.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, naflex=True)
    >>> entry = naflex_entry(model)
    >>> entry["patch_size"], entry["max_num_patches"], entry["inputs"]["patches"]
    (8, 16, {'dtype': 'float32', 'shape': ['batch', 'tokens', 192]})
    """
    patches = vit_parts(model).patches
    budget = naflex_budget(model)
    return {
        "naflex": True,
        "patch_size": patches.patch_size,
        "channels": patches.channels,
        "max_num_patches": budget,
        "inputs": {
            name: {
                "dtype": spec.dtype,
                "shape": ["batch" if i == 0 else "tokens" if d is None else d
                          for i, d in enumerate(spec.shape)],
            }
            for name, spec in naflex_signature(model).items()
        },
        "make_inputs": f"keras_vit.naflex_inputs(images, patch_size={patches.patch_size}, "
        f"max_num_patches={budget}, preprocessing=record['preprocessing_config']); any "
        "token count is served (a larger budget: more detail, more compute)",
    }


def naflex_description(model):
    """The preprocessing of a NaFlex model's inputs, in words, for the records.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, naflex=True)
    >>> naflex_description(model)[:60]
    'NaFlex: each image resized, its aspect kept, to the largest '
    """
    patches = vit_parts(model).patches
    return (
        f"NaFlex: each image resized, its aspect kept, to the largest grid of "
        f"{patches.patch_size}-pixel patches within max_num_patches (PIL's antialiased "
        f"bilinear, as HF's Siglip2ImageProcessor: keras_vit.naflex_inputs), then float32 "
        f"{describe(naflex_preprocessing(model))}, cut into patches flattened in (row, "
        "column, channel) order, padded with zeros to one token count (patch_mask 0), "
        "with each image's patch rows and columns in spatial_shapes"
    )


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

    A NaFlex model's record has `inputs` and `naflex` (`naflex_entry`) instead of
    `input`, and the NaFlex preprocessing (`naflex_description`); it takes no crop.
    """
    if is_naflex(model):
        if crop_fraction is not None:
            raise ValueError(
                f"crop_fraction={crop_fraction} crops to the model's size, but NaFlex model "
                f"{model.name!r} takes each whole image at its own aspect ratio: leave it out."
            )
        return _checked({
            "keras_vit_version": __version__,
            "keras_version": keras.__version__,
            "backend": keras.backend.backend(),
            "naflex": naflex_entry(model),
            "output_shape": ["batch", *model.outputs[0].shape[1:]],
            "preprocessing": naflex_description(model),
            "preprocessing_config": naflex_preprocessing(model),
            "crop_fraction": None,
            "labels": None if labels is None else [str(label) for label in labels],
            "metadata": metadata,
        }, metadata)
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
    return _checked(record, metadata)


def _checked(record, metadata):
    """`record`, once it is known to be JSON-serialisable (else a `ValueError` naming
    `metadata`, the only part that may not be)."""
    try:
        json.dumps(record)
    except TypeError as error:
        raise ValueError(f"metadata must be JSON-serialisable, got {metadata!r}: {error}.") from error
    return record


def compare_with_keras(model, run, runtime, *, batch_size=3, seed=0, tolerance=TOLERANCE):
    """The largest absolute difference between an exported file's outputs and Keras'.

    A NaFlex model is checked on `batch_size` random images of mixed aspect ratios
    (`NAFLEX_CHECK_GRIDS`) made into its inputs by `keras_vit.naflex_inputs` at two
    token counts (its budget and half of it), with one export: the dynamic token count.

    Args:
        model: the Keras model the file was exported from.
        run: runs the file: float32 images `(batch, height, width, channels)` (a NaFlex
            model: the dict of `naflex_inputs`) to outputs.
        runtime: the runtime's name, for the error message.
        batch_size: images in the batch (the exports trace other sizes, so this checks
            the variable batch dimension too).
        seed: seed of the uniform [-1, 1] test images (NaFlex: uint8 pixels).
        tolerance: raise a `ValueError` naming the difference when it exceeds this
            times the largest output (at least 1); None never raises.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=3)
    >>> compare_with_keras(model, lambda x: model.predict(x, verbose=0), "Keras")
    0.0
    """
    rng = np.random.default_rng(seed)
    if is_naflex(model):
        batches = [naflex_inputs(images, patch_size, tokens, naflex_preprocessing(model))
                   for images, patch_size, tokens in naflex_check_images(model, batch_size, rng)]
    else:
        shape = (batch_size, *image_input_size(model, "compare_with_keras"))
        batches = [rng.uniform(-1, 1, shape).astype("float32")]
    difference = bound = 0.0
    for inputs in batches:
        served = np.asarray(run(inputs))
        expected = keras.ops.convert_to_numpy(model(inputs, training=False))
        difference = max(difference, float(np.max(np.abs(served - expected))))
        bound = max(bound, float(np.max(np.abs(expected))))
    bound = None if tolerance is None else tolerance * max(1.0, bound)
    if bound is not None and difference > bound:
        raise ValueError(
            f"{runtime}'s outputs differ from Keras' by up to {difference:.3g} (more than "
            f"{bound:.3g}): the export is wrong; please report it with the model config."
        )
    return difference


def naflex_check_images(model, batch_size, rng):
    """`(images, patch_size, tokens)` twice, at the NaFlex model's token budget and at
    half of it: `batch_size` random uint8 images of mixed aspect ratios
    (`NAFLEX_CHECK_GRIDS`, cycled), what `compare_with_keras` checks exports on.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, naflex=True)
    >>> [(len(images), [image.shape for image in images[:2]], tokens)
    ...  for images, _, tokens in naflex_check_images(model, 3, np.random.default_rng(0))]
    [(3, [(24, 56, 3), (41, 17, 3)], 16), (3, [(24, 56, 3), (41, 17, 3)], 8)]
    """
    patches = vit_parts(model).patches
    size = patches.patch_size
    images = [
        rng.integers(0, 256, (rows * size + i % 2, cols * size + i % 2, patches.channels),
                     dtype=np.uint8)
        for i, (rows, cols) in zip(range(batch_size), NAFLEX_CHECK_GRIDS * batch_size)
    ]
    budget = naflex_budget(model)
    return [(images, size, tokens) for tokens in (budget, max(1, budget // 2))]


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
