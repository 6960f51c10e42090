"""The preprocessing a checkpoint expects: pixel mean and std, resize filter and crop.

A preprocessing is a dict of the fields that timm's `pretrained_cfg` (`mean`, `std`,
`interpolation`, `crop_pct`) and HF's image-processor config (`image_mean`,
`image_std`, `resample`, crop size over resize size) record for a checkpoint:
`{"mean": [r, g, b], "std": [r, g, b], "interpolation": "bilinear" | "bicubic",
"antialias": bool, "crop_fraction": None | fraction}`. A model built with one keeps it
(`VisionTransformer(preprocessing=...)`, recorded in its config); a model without one
takes `DEFAULT`, the official ViT checkpoints' (pixels scaled to [-1, 1], the whole
image resized bilinearly without antialiasing, as vit_jax evaluates them).

The resize is the filter `interpolation` (the triangle or Keys' a=-0.5 cubic) sampled
at pixel centres; `antialias` widens it by the shrink factor when shrinking:
- `antialias=False` (bilinear only) is TensorFlow's `tf.image.resize` (vit_jax's and
  big_vision's evaluation): each output pixel from its 2 by 2 nearest input pixels.
- `antialias=True` is PIL's `Image.resize` filter (timm's and HF's image processors:
  `resample` 2 bilinear, 3 bicubic), computed in float (PIL rounds to uint8 after each
  of its two passes) and, for bicubic, clipped to [0, 255] as PIL's 8-bit result is.
A dict without `antialias` (written before the field existed: models' configs, run
folders, registry entries) means what its `interpolation` meant then: bicubic
antialiased, bilinear not (`resize_filter`).

`normalize` is the one map from float pixels in [0, 255] to the model's input, used
by `keras_vit.preprocess`, `read_images` (`classify`, `keras-vit predict`), the
SavedModel's serving graph and the training and evaluation pipelines. It is written
with arithmetic operators only, so it runs on NumPy arrays, Keras backend tensors and
inside `tf.data` alike.
"""

import numpy as np

from keras_vit.utils.checks import check_choice, check_in_range

INTERPOLATIONS = ("bilinear", "bicubic")
DEFAULT = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "interpolation": "bilinear",
           "antialias": False, "crop_fraction": None}
# torchvision's ImageNet statistics (timm's IMAGENET_DEFAULT_MEAN / _STD).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# OpenAI CLIP's pixel statistics (its `preprocess`, timm's OPENAI_CLIP_MEAN / _STD).
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def check_preprocessing(preprocessing):
    """The preprocessing dict in its recorded form (lists of floats, every field), once
    checked.

    Missing fields take `DEFAULT`'s, but a missing `antialias` takes its
    `interpolation`'s (`resize_filter`); an unknown field or a bad value is a
    `ValueError` naming it.

    Example:

    >>> checked = check_preprocessing({"mean": (0.485, 0.456, 0.406),
    ...     "std": (0.229, 0.224, 0.225), "interpolation": "bicubic", "crop_fraction": 0.9})
    >>> checked["antialias"], checked["crop_fraction"]
    (True, 0.9)
    """
    if not isinstance(preprocessing, dict):
        raise ValueError(
            "preprocessing must be a dict with mean, std, interpolation and crop_fraction, "
            f"got {preprocessing!r}."
        )
    unknown = sorted(set(preprocessing) - set(DEFAULT))
    if unknown:
        raise ValueError(
            f"preprocessing has unknown fields {', '.join(unknown)}: it takes "
            f"{', '.join(DEFAULT)}."
        )
    checked = {**DEFAULT, "antialias": None, **preprocessing}
    for name in ("mean", "std"):
        value = checked[name]
        try:
            values = [float(v) for v in value]
        except (TypeError, ValueError):
            values = []
        if len(values) not in (1, 3) or (name == "std" and not all(v > 0 for v in values)):
            raise ValueError(
                f"preprocessing {name} must be 1 or 3 numbers (per channel, in [0, 1] pixel "
                f"units{', positive' if name == 'std' else ''}), got {value!r}."
            )
        checked[name] = values
    checked["antialias"] = resize_filter(checked["interpolation"], checked["antialias"])[1]
    if checked["crop_fraction"] is not None:
        check_in_range("preprocessing crop_fraction", checked["crop_fraction"], "(0, 1]",
                       optional=True)
        checked["crop_fraction"] = float(checked["crop_fraction"])
    return checked


def resize_filter(interpolation, antialias=None):
    """`(interpolation, antialias)` once checked; `antialias=None` (a preprocessing
    recorded before the field existed) takes what `interpolation` meant then: bicubic
    antialiased (PIL's), bilinear not (TensorFlow's). A bad value is a `ValueError`
    naming it.

    Example:

    >>> resize_filter("bilinear"), resize_filter("bicubic")
    (('bilinear', False), ('bicubic', True))
    """
    check_choice("preprocessing interpolation", interpolation, INTERPOLATIONS)
    if antialias is None:
        return interpolation, interpolation == "bicubic"
    if not isinstance(antialias, bool):
        raise ValueError(
            f"preprocessing antialias must be True (PIL's resize, as timm and HF) or False "
            f"(TensorFlow's, as vit_jax), got {antialias!r}."
        )
    if interpolation == "bicubic" and not antialias:
        raise ValueError(
            "preprocessing antialias=False is TensorFlow's bilinear resize only: bicubic "
            "is PIL's, antialias=True."
        )
    return interpolation, antialias


def model_preprocessing(model):
    """The preprocessing `model` was built with (its config's), else `DEFAULT`.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=3)
    >>> model_preprocessing(model)["interpolation"]
    'bilinear'
    """
    recorded = getattr(model, "preprocessing", None)  # a keras_vit.ViT's, without get_config
    if recorded is None:  # (Keras' serialisation imports TensorFlow where it is installed)
        get_config = getattr(model, "get_config", None)
        config = get_config() if callable(get_config) else {}
        recorded = (config or {}).get("preprocessing")
    return check_preprocessing(recorded or DEFAULT)


def normalize(pixels, preprocessing=None):
    """Float32 pixels in [0, 255] to the model's input: `(pixels / 255 - mean) / std`.

    Computed as `(pixels - 255 mean) / (255 std)`, with one scalar when the three
    channels share it, so that `DEFAULT` is exactly `(pixels - 127.5) / 127.5`.

    Args:
        pixels: float32 `(..., channels)` pixels: a NumPy array, a backend tensor or a
            TensorFlow tensor (in `tf.data`).
        preprocessing: a preprocessing dict (see `check_preprocessing`), or None for
            `DEFAULT`.

    Returns:
        The model input, as the type of `pixels`.

    Example:

    >>> normalize(np.array([0.0, 127.5, 255.0], "float32")).tolist()
    [-1.0, 0.0, 1.0]
    """
    shift, scale = shift_and_scale(preprocessing)
    return (pixels - shift) / scale


def shift_and_scale(preprocessing=None):
    """`(255 mean, 255 std)` as float32: scalars when the channels share them, else
    per-channel arrays. `255 mean` is the pixel that normalises to 0 (the model's zero).

    Example:

    >>> shift_and_scale()
    (np.float32(127.5), np.float32(127.5))
    """
    preprocessing = check_preprocessing(preprocessing or DEFAULT)
    return tuple(
        np.float32(values[0] * 255) if len(set(values)) == 1
        else np.asarray(values, "float64").astype("float32") * np.float32(255)
        for values in (preprocessing["mean"], preprocessing["std"])
    )


def resize_name(preprocessing=None):
    """The resize filter of `preprocessing` in words, for the records exports write.

    Example:

    >>> resize_name(), resize_name({"interpolation": "bicubic"})
    ('bilinear', 'antialiased bicubic')
    """
    preprocessing = check_preprocessing(preprocessing or DEFAULT)
    return "antialiased " * preprocessing["antialias"] + preprocessing["interpolation"]


def describe(preprocessing=None):
    """`normalize` in words, for the records exports write.

    Example:

    >>> describe()
    '(x - 127.5) / 127.5'
    """
    preprocessing = check_preprocessing(preprocessing or DEFAULT)
    mean, std = preprocessing["mean"], preprocessing["std"]
    if len(set(mean)) == 1 and len(set(std)) == 1:
        return f"(x - {mean[0] * 255:g}) / {std[0] * 255:g}"
    return f"(x / 255 - mean) / std, mean {mean}, std {std} per channel (RGB)"
