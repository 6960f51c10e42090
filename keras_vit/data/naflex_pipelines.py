"""The pieces of the NaFlex input pipelines (`tf.data`, TensorFlow-only): what
`keras_vit.data.pipelines.train_dataset` and `eval_dataset` do to each image and batch
with `naflex=NaFlexLayout(...)`, for a `keras_vit.ViT(naflex=True)`.

Each image is cropped (the inception crop, drawn relative to the image's own aspect
ratio: `native_crop_window`), resized, its aspect kept, to the largest patch grid within
the token budget (`keras_vit.data.naflex.naflex_size`, HF's search, by
`tf.numpy_function`: one search; with `naflex_inputs`' antialiased bilinear filter),
normalised and cut into patches in `naflex_inputs`' order (`patchify`). Batches
(`naflex_batch`) come in two layouts:

- padded (`images_per_row=None`): `({patches (batch, T, P*P*C), patch_mask (batch, T),
  spatial_shapes (batch, 2)}, labels (batch, classes))`, `T` the smallest of the
  layout's buckets that holds the batch's longest image, so that XLA and
  `torch.compile` compile once per bucket, not per batch;
- packed (`images_per_row=K`): the batch's images packed into rows of `row_tokens`
  tokens with up to K images each (`keras_vit.data.naflex.pack_rows`), the layout of
  `keras_vit.ViT(naflex=True, images_per_row=K)`: `(x, labels (rows, K, classes),
  sample_weight (rows, K))`, 0 for an empty slot.
"""

import math

import numpy as np
import tensorflow as tf

from keras_vit.data.decode import resize
from keras_vit.data.naflex import naflex_size, pack_rows


def native_size(height, width, patch_size, max_num_patches):
    """`naflex_size` in a TensorFlow graph: the `(height, width)` int32 an image is
    resized to (its Python search, run by `tf.numpy_function`: the same sizes).

    Example:

    >>> native_size(tf.constant(480), tf.constant(640), 16, 256).numpy().tolist()
    [224, 288]
    """

    def search(h, w):
        return np.asarray(naflex_size(int(h), int(w), patch_size, max_num_patches), np.int32)

    size = tf.numpy_function(search, [height, width], tf.int32, stateful=False)
    size.set_shape([2])
    return size


def native_crop_window(seed, area_range=(0.05, 1.0), aspect_ratio_range=(3 / 4, 4 / 3)):
    """A `window_fn` (see `keras_vit.data.decode.decode_crop`) drawing the inception crop
    relative to the image: a window of `area_range` of its area whose aspect ratio is
    the image's own times a factor drawn log-uniformly from `aspect_ratio_range`, at a
    uniform position. (The fixed-size pipeline's crop draws the aspect ratio itself,
    which would square every image.)

    Example:

    >>> offset, size = native_crop_window([0, 1], (1.0, 1.0), (1.0, 1.0))(tf.constant([30, 90, 3]))
    >>> size.numpy().tolist()
    [30, 90, -1]
    """
    area_seed, ratio_seed, top_seed, left_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 4)
    )
    low, high = (math.log(r) for r in aspect_ratio_range)

    def window(shape):
        height, width = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
        area = tf.random.stateless_uniform([], area_seed, *area_range)
        ratio = tf.exp(tf.random.stateless_uniform([], ratio_seed, low, high))
        rows = tf.clip_by_value(tf.cast(tf.round(height * tf.sqrt(area / ratio)), tf.int32), 1, shape[0])
        cols = tf.clip_by_value(tf.cast(tf.round(width * tf.sqrt(area * ratio)), tf.int32), 1, shape[1])
        top = tf.random.stateless_uniform([], top_seed, 0, shape[0] - rows + 1, tf.int32)
        left = tf.random.stateless_uniform([], left_seed, 0, shape[1] - cols + 1, tf.int32)
        return tf.stack([top, left, 0]), tf.stack([rows, cols, -1])

    return window


def resize_native(image, patch_size, max_num_patches):
    """One image `(height, width, channels)` (pixels in [0, 255]) resized, its aspect
    kept, to the largest patch grid within `max_num_patches` (`native_size`), with
    `naflex_inputs`' filter (bilinear, antialiased); float32."""
    size = native_size(tf.shape(image)[0], tf.shape(image)[1], patch_size, max_num_patches)
    return resize(tf.cast(image, tf.float32), size, "bilinear", antialias=True)


def patchify(image, patch_size):
    """`(patches, grid)` of one image whose sides are multiples of `patch_size`: its
    patches `(rows * cols, P * P * channels)` in row-major order, each flattened in
    (row, column, channel) order as `naflex_inputs` cuts them, and `(rows, cols)`.

    Example:

    >>> patches, grid = patchify(tf.reshape(tf.range(8.0), (2, 4, 1)), 2)
    >>> patches.numpy().tolist(), grid.numpy().tolist()
    ([[0.0, 1.0, 4.0, 5.0], [2.0, 3.0, 6.0, 7.0]], [1, 2])
    """
    channels = image.shape[-1]
    rows, cols = tf.shape(image)[0] // patch_size, tf.shape(image)[1] // patch_size
    grid = tf.reshape(image, [rows, patch_size, cols, patch_size, channels])
    patches = tf.reshape(tf.transpose(grid, [0, 2, 1, 3, 4]), [rows * cols, patch_size**2 * channels])
    return patches, tf.stack([rows, cols])


def naflex_batch(patches, grids, labels, layout, rows):
    """A batch of images' patches `(images, longest, P*P*C)` (padded to the longest),
    their grids and one-hot labels to the model's batch in `layout` (a `NaFlexLayout`):
    padded to the smallest of its buckets holding the longest image, or packed into
    `rows` rows (`pack_rows`), labels `(rows, K, classes)` and sample weights `(rows, K)`."""
    lengths = grids[:, 0] * grids[:, 1]
    if layout.images_per_row is not None:
        row_tokens, slots = layout.row_tokens, layout.images_per_row

        def pack(patches, lengths, grids):
            inputs, index = pack_rows(patches, lengths, grids, rows, row_tokens, slots)
            return inputs["patches"], inputs["patch_mask"], inputs["spatial_shapes"], index

        packed, mask, shapes, index = tf.numpy_function(
            pack, [patches, lengths, grids], [tf.float32, tf.int32, tf.int32, tf.int32],
            stateful=False,
        )
        packed.set_shape([rows, row_tokens, patches.shape[-1]])
        mask.set_shape([rows, row_tokens])
        shapes.set_shape([rows, slots, 2])
        index.set_shape([rows, slots])
        filled = index >= 0
        slot_labels = tf.gather(labels, tf.maximum(index, 0)) * tf.cast(filled, tf.float32)[..., None]
        x = {"patches": packed, "patch_mask": mask, "spatial_shapes": shapes}
        return x, slot_labels, tf.cast(filled, tf.float32)
    bucket_counts = tf.constant(layout.buckets, tf.int32)
    longest = tf.reduce_max(tf.concat([lengths, [1]], 0))
    tokens = tf.gather(bucket_counts, tf.searchsorted(bucket_counts, [longest])[0])
    patches = tf.pad(patches, [[0, 0], [0, tokens - tf.shape(patches)[1]], [0, 0]])
    mask = tf.cast(tf.range(tokens)[None] < lengths[:, None], tf.int32)
    return {"patches": patches, "patch_mask": mask, "spatial_shapes": grids}, labels


def blank_image(patch_size, channels):
    """The stand-in `(patches, grid)` of an image that failed to decode: one zero patch."""
    return lambda: (tf.zeros([1, patch_size**2 * channels]), tf.constant([1, 1], tf.int32))


def padded_images(dataset, batch_size, patch_size, channels, drop_remainder):
    """`dataset` of `((patches, grid), label, decoded)` batched, patches padded to the batch's longest."""
    shapes = (([None, patch_size**2 * channels], [2]), [None], [])
    return dataset.padded_batch(batch_size, padded_shapes=shapes, drop_remainder=drop_remainder)
