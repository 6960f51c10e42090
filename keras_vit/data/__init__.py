"""Input data: sources, decoding, augmentation, pipelines (`tf.data`), and image files
read without TensorFlow.

- `sources`: where labelled images come from (digits, TFDS, image folders) as a `Source`.
- `folders`: image folders listed and checked without decoding, the listing cached.
- `headers`: image files judged from their bytes (format, structure, pixel count).
- `libjpeg`: JPEGs that decode with a libjpeg warning, checked off the start-up path.
- `decode`: files to pixels, crop windows, the eval resize, in `tf.data`.
- `images`: `read_images`, files to a batch of model inputs with PIL and NumPy (the same
  pixels as `decode`), and `read_pixels`, one file's uint8 pixels at its own size, so
  that `classify` and `keras-vit predict` need no TensorFlow.
- `naflex`: `naflex_inputs`, images of any sizes to a NaFlex model's patches (the pixels
  of HF's `Siglip2ImageProcessor`), without TensorFlow.
- `naflex_pipelines`: what the pipelines do with `naflex=NaFlexLayout(...)`: a NaFlex
  model's batches, each image at its own aspect (padded or packed).
- `augment`: AugReg levels and Keras preprocessing layers seeded by stream position.
- `pipelines`: `train_dataset` (endless, seeded, resumable), `eval_dataset` (one pass),
  fixed-size or NaFlex.
- from `keras_vit.utils.tf_data`: `without_autotuning` (the options both pipelines end
  with), `array_batches` (arrays through it, as the model's `fit`, `predict` and `evaluate`
  read them).

The names below are the package's API: `from keras_vit.data import load_source, train_dataset`.
Each is imported from its module when first used, so that `read_images` does not import
TensorFlow (which the other modules use).
"""

import importlib

# The package's names and the module each comes from (a module of the package, or a full name).
_MODULES = {
    "augment": ("AUGREG_LEVELS", "as_layer", "augmentation_layers"),
    "decode": ("central_crop", "channel_note", "check_crop_fraction", "decode_pixels",
               "eval_resize", "inception_crop_window", "limit_pixels"),
    "folders": ("IMAGE_EXTENSIONS", "find_damaged", "load_listing"),
    "images": ("read_images", "read_pixels"),
    "naflex": ("NaFlexLayout", "naflex_inputs", "pack_rows"),
    "pipelines": ("eval_dataset", "train_dataset"),
    "sources": ("NoSplitError", "Source", "load_source", "parse_classes", "select_classes",
                "spec_split"),
    "keras_vit.utils.tf_data": ("array_batches", "without_autotuning"),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}
_SUBMODULES = ("augment", "decode", "folders", "headers", "images", "libjpeg", "naflex",
               "naflex_pipelines", "pipelines", "sources")

__all__ = sorted(_HOME)


def __getattr__(name):
    """The package's name `name` from its module, or the module `name` (imported then)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = _HOME[name]
    module = importlib.import_module(home if "." in home else f"{__name__}.{home}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *__all__})
