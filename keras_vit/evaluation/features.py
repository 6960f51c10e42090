"""Frozen features of a model: the representation few-shot evaluation and probes read.

`representation_model` cuts a model at its representation (`pre_logits` or the pooled
output); `extract_features` runs it over arrays or a `tf.data.Dataset` in fixed-size
batches (the last one padded, so the forward pass compiles once) and returns numpy
features with the labels that came with the images.
"""

import keras
import numpy as np

from keras_vit.models.vit import vit_parts
from keras_vit.utils.checks import check_positive_int
from keras_vit.utils.keras_compat import progress_verbosity

def representation_model(model, layer=None):
    """Returns a `keras.Model` from `model`'s input to its representation.

    The representation is the output of the layer named `layer` if given, else of a
    ViT's `pre_logits` (the representation layer) when it has one, else of its
    `pool`, or of the final norm that follows the pool (`fc_norm=True`, as EVA-02's
    timm pre-logits). A model that outputs `(batch, features)` itself (e.g. a ViT built with
    `include_top=False`, or another encoder) is used as it is.

    Example:

    >>> import keras_vit
    >>> vit = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32,
    ...                     num_layers=2, num_heads=4, mlp_dim=64)
    >>> representation_model(vit).output.shape
    (None, 32)
    """
    if layer is None:
        try:
            parts = vit_parts(model)
            found = parts.pool if parts.pre_logits is None else parts.pre_logits
            if found is parts.pool and found is not None and len(parts.norm.output.shape) == 2:
                found = parts.norm  # fc_norm: the norm normalises the pooled features
        except ValueError:  # another encoder
            found = None
        if found is None:
            if len(model.outputs) == 1 and len(model.outputs[0].shape) == 2:
                return model
            raise ValueError(
                f"Model {model.name!r} has no 'pre_logits' or 'pool' layer and does not "
                "output pooled features: pass layer=NAME, or build it with pooling=True."
            )
    else:
        names = [sub.name for sub in getattr(model, "layers", [])]
        if layer not in names:
            raise ValueError(
                f"Model {model.name!r} has no layer {layer!r}: expected one of "
                f"{', '.join(names)}."
            )
        found = model.get_layer(layer)
    output = found.output
    if len(output.shape) != 2:
        raise ValueError(
            f"Layer {found.name!r} outputs shape {tuple(output.shape)}: few-shot features "
            "must be (batch, features); use the pooled output."
        )
    return keras.Model(model.inputs, output, name=f"{model.name}_features")


def integer_labels(labels):
    """Class ids `(N,)` from integer labels or one-hot (or soft) label rows `(N, classes)`.

    Example:

    >>> integer_labels(np.eye(3)[[2, 0]]).tolist()
    [2, 0]
    """
    labels = np.asarray(labels)
    if labels.ndim == 2:  # one-hot or soft labels, as training pipelines yield them
        labels = labels.argmax(axis=-1)
    return labels.reshape(-1)


def image_batches(data, labels, batch_size):
    """Yields `(images, labels)` batches of numpy arrays from arrays or a `tf.data.Dataset`.

    Args:
        data: an array of images (or a NaFlex model's dict of arrays, `naflex_inputs`'),
            or a `tf.data.Dataset` of images or `(images, labels)`, batched or single
            images (then batched here).
        labels: labels of array `data` (or None); must be None for a dataset.
        batch_size: images per batch of array data or of an unbatched dataset.

    Example:

    >>> [(len(x), y.tolist()) for x, y in image_batches(np.zeros((5, 2, 2, 1)), [0, 1, 2, 3, 4], 2)]
    [(2, [0, 1]), (2, [2, 3]), (1, [4])]
    """
    if hasattr(data, "as_numpy_iterator"):  # a tf.data.Dataset, without importing tf
        if labels is not None:
            raise ValueError(
                "labels must be None when data is a tf.data.Dataset: the dataset yields "
                "(images, labels) batches itself."
            )
        spec = data.element_spec
        image_spec = spec[0] if isinstance(spec, tuple) else spec
        if isinstance(image_spec, dict):  # NaFlex inputs
            image_spec = image_spec["patches"]
            single = len(image_spec.shape) == 2
        else:
            single = len(image_spec.shape) == 3
        if single:  # single images: batch them here
            data = data.batch(batch_size)
        for element in data.as_numpy_iterator():
            if isinstance(element, tuple):
                yield element[0], element[1]
            else:
                yield element, None
        return
    images = {k: np.asarray(v) for k, v in data.items()} if isinstance(data, dict) else np.asarray(data)
    count = batch_length(images)
    if labels is not None and len(labels) != count:
        raise ValueError(
            f"Got {count} images but {len(labels)} labels: expected one label per image."
        )
    for start in range(0, count, batch_size):
        end = start + batch_size
        batch = ({k: v[start:end] for k, v in images.items()} if isinstance(images, dict)
                 else images[start:end])
        yield batch, None if labels is None else np.asarray(labels)[start:end]


def batch_length(images):
    """The images in a batch: an array's rows, or those of a NaFlex dict's `patches`.

    Example:

    >>> batch_length({"patches": np.zeros((3, 5, 4)), "patch_mask": np.ones((3, 5))})
    3
    """
    if isinstance(images, dict):
        return len(images["patches"])
    return len(images)


def padded_batch(images, rows):
    """A batch of images padded to `rows`: with zero images, or a NaFlex dict's (whose
    rows must stay valid inputs: every image needs a grid) with copies of its last row.

    Example:

    >>> padded_batch(np.ones((1, 2)), 3).tolist()
    [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    >>> padded_batch({"spatial_shapes": np.array([[2, 3]])}, 2)["spatial_shapes"].tolist()
    [[2, 3], [2, 3]]
    """
    if isinstance(images, dict):
        return {key: np.concatenate([value, np.repeat(value[-1:], rows - len(value), axis=0)])
                for key, value in images.items()}
    images = np.asarray(images)
    pad = np.zeros((rows - len(images), *images.shape[1:]), images.dtype)
    return np.concatenate([images, pad])


def extract_features(model, data, labels=None, *, batch_size=256, layer=None, verbose=0):
    """Computes a model's frozen representation of a set of images.

    Args:
        model: a keras-vit model (any backend); see `representation_model` for which
            layer's output is used.
        data: images as the model takes them (NHWC, scaled with
            `keras_vit.preprocess`; a NaFlex model's dict, `keras_vit.naflex_inputs`',
            each image at its own aspect), or a `tf.data.Dataset` of image batches or
            `(images, labels)` batches (integer or one-hot labels).
        labels: labels of array `data` (optional), passed through.
        batch_size: images per forward pass (and per batch of an unbatched dataset).
        layer: name of the layer whose output is the representation.
        verbose: 1 shows a progress bar (`"auto"`: on a terminal only).

    Returns:
        `(features, labels)`: float32 array `(N, D)` and integer labels `(N,)`,
        or None where there are none.

    Example:

    >>> import keras_vit
    >>> vit = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32,
    ...                     num_layers=2, num_heads=4, mlp_dim=64)
    >>> features, _ = extract_features(vit, np.zeros((3, 32, 32, 3), "float32"))
    >>> features.shape
    (3, 32)
    """
    extractor = representation_model(model, layer)
    return extract_with(extractor, data, labels, batch_size=batch_size, verbose=verbose)


def extract_with(extractor, data, labels=None, *, batch_size=256, verbose=0):
    """`extract_features` with a feature model already built (`representation_model`).

    Reusing one extractor for several splits compiles its forward pass once.

    Example:

    >>> import keras_vit
    >>> vit = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32,
    ...                     num_layers=2, num_heads=4, mlp_dim=64)
    >>> features, labels = extract_with(representation_model(vit), np.zeros((3, 32, 32, 3)), [1, 2, 3])
    >>> features.shape, labels.tolist()
    ((3, 32), [1, 2, 3])
    """
    batch_size = check_positive_int("batch_size", batch_size)
    progress = keras.utils.Progbar(None, unit_name="image") if progress_verbosity(verbose) == 1 else None
    features, all_labels, full = [], [], None
    for images, batch_labels in image_batches(data, labels, batch_size):
        count = batch_length(images)
        full = full or count
        if count < full:  # one input shape per extractor: no retracing or recompiling
            images = padded_batch(images, full)
        outputs = np.asarray(extractor.predict_on_batch(images))
        features.append(outputs[:count].astype("float32"))
        if batch_labels is not None:
            all_labels.append(integer_labels(batch_labels))
        if progress is not None:
            progress.add(count)
    if progress is not None:
        progress.update(sum(len(f) for f in features), finalize=True)  # ends the line
    if not features:
        raise ValueError("No images to extract features from: data is empty.")
    labels = np.concatenate(all_labels) if all_labels else None
    return np.concatenate(features), labels
