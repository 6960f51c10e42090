"""Classifying image files with a model: the top-k classes, named, with probabilities."""

import os

import keras
import numpy as np

from keras_vit.data import read_images
from keras_vit.models.vit import default_image_size
from keras_vit.weights import registry


def classify(model, images, *, top_k=5, labels=None, activation=None, crop_fraction=None):
    """The `top_k` classes of each image file, as the checkpoint was evaluated.

    Each image is decoded, resized whole (bilinear) to the model's input size and scaled
    to [-1, 1] (`keras_vit.data.read_images`), as vit_jax evaluates the
    official checkpoints; `crop_fraction` takes a run's central crop instead.

    Args:
        model: a `keras_vit.ViT` model with a head, e.g. from `keras_vit.pretrained`.
        images: an image file path, or a list of them.
        top_k: classes per image.
        labels: class names in class order; default: the label set of the model's
            registry checkpoint (`model.weights_entry`), else `"class {i}"`.
        activation: `"softmax"` or `"sigmoid"`; default: the checkpoint's (sigmoid for
            the ImageNet-21k heads, trained with the sigmoid cross-entropy), else softmax.
        crop_fraction: central crop of the preprocessing, or None for the whole image.

    Returns:
        One dict per image: `{"image": path, "top_k": [{"class": index, "label": name,
        "probability": p}, ...]}`, most probable first.

    Example:

    >>> import tempfile, tensorflow as tf, keras_vit
    >>> path = os.path.join(tempfile.mkdtemp(), "red.png")
    >>> tf.io.write_file(path, tf.io.encode_png(tf.constant([[[255, 0, 0]]], tf.uint8)))
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=3)
    >>> classify(model, path, top_k=1, labels=["a", "b", "c"])[0]["top_k"]
    [{'class': 0, 'label': 'a', 'probability': 0.3333333333333333}]
    """
    paths = [images] if isinstance(images, (str, os.PathLike)) else list(images)
    entry = getattr(model, "weights_entry", None)
    if labels is None and entry is not None and entry.labels is not None:
        labels = registry.class_names(entry.labels)
    activation = activation or (entry.activation if entry is not None else "softmax")
    if activation not in ("softmax", "sigmoid"):
        raise ValueError(f"activation must be 'softmax' or 'sigmoid', got {activation!r}.")
    height, width = default_image_size(model)
    channels = model.input_shape[-1]
    classes = model.output_shape[-1]
    if labels is not None and len(labels) != classes:
        raise ValueError(f"{len(labels)} labels for a model with {classes} classes.")
    if not 1 <= top_k:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}.")
    batch = read_images(paths, (height, width), channels=channels, crop_fraction=crop_fraction)
    logits = keras.ops.convert_to_numpy(model.predict_on_batch(batch)).astype("float64")
    if activation == "softmax":
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probabilities = shifted / shifted.sum(axis=-1, keepdims=True)
    else:
        probabilities = 1 / (1 + np.exp(-logits))
    results = []
    for path, row in zip(paths, probabilities):
        best = np.argsort(-row, kind="stable")[:top_k]
        top = [
            {
                "class": int(i),
                "label": labels[i] if labels is not None else f"class {i}",
                "probability": float(row[i]),
            }
            for i in best
        ]
        results.append({"image": os.fspath(path), "top_k": top})
    return results
