"""Input data (`tf.data`, TensorFlow-only): sources, decoding, augmentation, pipelines.

- `sources`: where labelled images come from (digits, TFDS, image folders) as a `Source`.
- `folders`: image folders listed and checked without decoding, the listing cached.
- `headers`: image files judged from their bytes (format, structure, pixel count).
- `libjpeg`: JPEGs that decode with a libjpeg warning, checked off the start-up path.
- `decode`: files to pixels, crop windows, the eval resize, `read_images`.
- `augment`: AugReg levels and Keras preprocessing layers seeded by stream position.
- `pipelines`: `train_dataset` (endless, seeded, resumable), `eval_dataset` (one pass).
- from `keras_vit.utils.tf_data`: `without_autotuning` (the options both pipelines end
  with), `array_batches` (arrays through it, as the model's `predict` reads them).

The names below are the package's API: `from keras_vit.data import load_source, train_dataset`.
"""

from keras_vit.data.augment import AUGREG_LEVELS, as_layer, augmentation_layers
from keras_vit.data.decode import (
    central_crop,
    channel_note,
    check_crop_fraction,
    decode_pixels,
    eval_resize,
    inception_crop_window,
    limit_pixels,
    read_images,
)
from keras_vit.data.folders import IMAGE_EXTENSIONS, find_damaged, load_listing
from keras_vit.data.pipelines import eval_dataset, train_dataset
from keras_vit.data.sources import (
    NoSplitError,
    Source,
    load_source,
    parse_classes,
    select_classes,
    spec_split,
)
from keras_vit.utils.tf_data import array_batches, without_autotuning

__all__ = [
    "AUGREG_LEVELS", "IMAGE_EXTENSIONS", "NoSplitError", "Source", "array_batches", "as_layer",
    "augmentation_layers", "central_crop", "channel_note", "check_crop_fraction",
    "decode_pixels", "eval_dataset", "eval_resize", "find_damaged", "inception_crop_window",
    "limit_pixels", "load_listing", "load_source", "parse_classes", "read_images",
    "select_classes", "spec_split", "train_dataset", "without_autotuning",
]
