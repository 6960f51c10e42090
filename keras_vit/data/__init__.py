"""Input pipelines: image sources and the paper's preprocessing (`tf.data`, TensorFlow-only).

- `pipelines`: sources (digits, TFDS, image folders), decoding, augmentation, and the
  `train_dataset` / `eval_dataset` streams.

`from keras_vit.data import load_source, train_dataset` keeps working.
"""

from keras_vit.data.pipelines import (  # noqa: F401
    eval_dataset,
    load_source,
    parse_classes,
    select_classes,
    train_dataset,
)
