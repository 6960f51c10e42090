"""Robustness probes from "Intriguing Properties of Vision Transformers" (Naseer et
al. 2021): accuracy as random patches are occluded and as image cells are shuffled.

Images are taken as the model sees them (NHWC, already scaled to [-1, 1]), so the
default occlusion value 0 is the mid-grey of that range.
"""

import json
import os

import numpy as np

from keras_vit.evaluation.analysis import patch_grid
from keras_vit.evaluation.features import image_batches, integer_labels
from keras_vit.utils.checks import check_in_range

DROP_FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
SHUFFLE_GRIDS = (1, 2, 4, 8)


def _check_images(images):
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(
            f"Expected images of shape (batch, height, width, channels), got shape {images.shape}."
        )
    return images


def drop_patches(images, fraction, patch_size, fill=0.0, rng=None):
    """Sets a random `fraction` of each image's patches to `fill` (PatchDrop).

    Each image gets its own random choice of `round(fraction * num_patches)`
    patches on the `patch_size` grid; the other pixels are unchanged.

    Example:

    >>> images = np.ones((2, 32, 32, 3), "float32")
    >>> dropped = drop_patches(images, 0.25, 8, rng=np.random.default_rng(0))
    >>> float((dropped == 0).mean())
    0.25
    """
    images = _check_images(images)
    check_in_range("fraction", fraction, "[0, 1]")
    batch, height, width, channels = images.shape
    if height % patch_size or width % patch_size:
        raise ValueError(
            f"Images of size {height}x{width} are not divisible by patch_size {patch_size}."
        )
    rows, cols = height // patch_size, width // patch_size
    count = int(round(fraction * rows * cols))
    rng = np.random.default_rng(rng)
    # argsort of uniform noise: an independent random permutation per image.
    chosen = np.argsort(rng.random((batch, rows * cols)), axis=1)[:, :count]
    mask = np.zeros((batch, rows * cols), bool)
    np.put_along_axis(mask, chosen, True, axis=1)
    mask = mask.reshape(batch, rows, 1, cols, 1, 1)
    out = images.reshape(batch, rows, patch_size, cols, patch_size, channels)
    out = np.where(mask, np.asarray(fill, images.dtype), out)
    return out.reshape(images.shape)


def shuffle_patches(images, grid, rng=None):
    """Cuts each image into `grid x grid` cells and permutes them at random.

    Every image gets its own permutation; `grid=1` returns the images unchanged.
    (The paper's "shuffle grid size" counts cells, i.e. `grid ** 2`.)

    Example:

    >>> images = np.arange(16.0).reshape(1, 4, 4, 1)
    >>> shuffled = shuffle_patches(images, 2, rng=np.random.default_rng(0))
    >>> sorted(shuffled.ravel().tolist()) == list(range(16))
    True
    """
    images = _check_images(images)
    batch, height, width, channels = images.shape
    if int(grid) != grid or grid < 1 or height % grid or width % grid:
        raise ValueError(
            f"Shuffle grid {grid!r} must be a positive integer dividing the image size "
            f"{height}x{width}."
        )
    grid = int(grid)
    cell_h, cell_w = height // grid, width // grid
    cells = images.reshape(batch, grid, cell_h, grid, cell_w, channels)
    cells = cells.transpose(0, 1, 3, 2, 4, 5).reshape(batch, grid * grid, cell_h, cell_w, channels)
    order = np.argsort(np.random.default_rng(rng).random((batch, grid * grid)), axis=1)
    cells = np.take_along_axis(cells, order[:, :, None, None, None], axis=1)
    cells = cells.reshape(batch, grid, grid, cell_h, cell_w, channels).transpose(0, 1, 3, 2, 4, 5)
    return cells.reshape(images.shape)


def robustness_probes(
    model,
    data,
    labels=None,
    *,
    drop_fractions=DROP_FRACTIONS,
    shuffle_grids=SHUFFLE_GRIDS,
    patch_size=None,
    fill=0.0,
    seed=0,
    batch_size=128,
):
    """Top-1 accuracy under patch occlusion and under patch shuffling, in one pass.

    Args:
        model: a classifier mapping images to logits (any keras-vit ViT).
        data: images as the model takes them (NHWC in [-1, 1]), or a
            `tf.data.Dataset` of `(images, labels)` (batched or not).
        labels: class ids (or one-hot rows) of array `data`; None for a dataset.
        drop_fractions: fractions of patches occluded (`drop_patches`).
        shuffle_grids: cells per side for `shuffle_patches`.
        patch_size: occlusion patch size in pixels; defaults to the model's token size.
        fill: value of occluded pixels (0 is mid-grey in [-1, 1]).
        seed: seed of the random patch choices and permutations.
        batch_size: images per forward pass (and per batch of an unbatched dataset).

    Returns:
        `{"accuracy": clean accuracy, "occlusion": {fraction: accuracy},
        "shuffle": {grid: accuracy}, "examples": count}`.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=10)
    >>> images, labels = np.zeros((4, 32, 32, 3), "float32"), np.zeros(4, int)
    >>> robustness_probes(model, images, labels, drop_fractions=[0.0, 0.5],
    ...                   shuffle_grids=[1, 2])["shuffle"]
    {1: 1.0, 2: 1.0}
    """
    if patch_size is None:
        _, patch_size = patch_grid(model)
    rng = np.random.default_rng(seed)
    correct = {"accuracy": 0, "occlusion": dict.fromkeys(drop_fractions, 0),
               "shuffle": dict.fromkeys(shuffle_grids, 0)}
    count = 0

    def hits(images, labels):
        logits = np.asarray(model.predict_on_batch(images))
        return int((logits.argmax(axis=-1) == labels).sum())

    for images, batch_labels in image_batches(data, labels, batch_size):
        if batch_labels is None:
            raise ValueError(
                "Robustness probes need labels: pass labels with array data, or a dataset "
                "of (images, labels)."
            )
        images = _check_images(images).astype("float32", copy=False)
        batch_labels = integer_labels(batch_labels)
        correct["accuracy"] += hits(images, batch_labels)
        for fraction in drop_fractions:
            dropped = drop_patches(images, fraction, patch_size, fill, rng)
            correct["occlusion"][fraction] += hits(dropped, batch_labels)
        for grid in shuffle_grids:
            correct["shuffle"][grid] += hits(shuffle_patches(images, grid, rng), batch_labels)
        count += len(images)
    if not count:
        raise ValueError("data holds no examples.")
    return {
        "accuracy": correct["accuracy"] / count,
        "occlusion": {f: c / count for f, c in correct["occlusion"].items()},
        "shuffle": {g: c / count for g, c in correct["shuffle"].items()},
        "examples": count,
    }


def save_results(results, out, **record):
    """Writes `probes.json` (`record`, e.g. the data's name, then `results`) and the
    `probes.png` figure under `out` (created); returns both paths.

    Example:

    >>> import tempfile
    >>> results = dict(examples=2, accuracy=1.0, occlusion={0.5: 0.5}, shuffle={2: 0.5})
    >>> [os.path.basename(p) for p in save_results(results, tempfile.mkdtemp(), data="x")]
    ['probes.json', 'probes.png']
    """
    from keras_vit.evaluation import charts  # matplotlib, imported only when used

    os.makedirs(out, exist_ok=True)
    numbers = os.path.join(out, "probes.json")
    with open(numbers, "w") as f:
        json.dump(dict(record, **results), f, indent=2)
    return numbers, charts.plot_probes(results, os.path.join(out, "probes.png"))
