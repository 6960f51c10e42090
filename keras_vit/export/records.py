"""What every exported file states about its input: its size and the eval preprocessing."""

import json

import keras
import numpy as np

from keras_vit import __version__
from keras_vit.models.preprocessing import DEFAULT, describe, model_preprocessing

# Peak absolute difference between a float export and Keras that `compare_with_keras`
# accepts, relative to the largest output (at least 1).
TOLERANCE = 1e-4


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
    method = preprocessing["interpolation"]
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
