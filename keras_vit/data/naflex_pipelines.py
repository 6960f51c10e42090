"""NaFlex input pipelines (`tf.data`, TensorFlow-only): a source to the batches of a
`keras_vit.ViT(naflex=True)`, each image at its own aspect ratio.

Each image is cropped (the inception crop, drawn relative to the image's own aspect
ratio), resized, its aspect kept, to the largest patch grid within the token budget
(`keras_vit.data.naflex.naflex_size`, HF's search, with the antialiased bilinear filter
of `naflex_inputs`), flipped, augmented per image, normalised with the model's
preprocessing and cut into patches in `naflex_inputs`' order. Batches come in two
layouts:

- padded (`images_per_row=None`): `({patches (batch, T, P*P*C), patch_mask (batch, T),
  spatial_shapes (batch, 2)}, labels (batch, classes))`, `T` the smallest of `buckets`
  that holds the batch's longest image, so that XLA and `torch.compile` compile once per
  bucket, not per batch;
- packed (`images_per_row=K`): the batch's images packed into rows of `row_tokens`
  tokens with up to K images each (`keras_vit.data.naflex.pack_rows`), the layout of
  `keras_vit.ViT(naflex=True, images_per_row=K)`: `(x, labels (rows, K, classes),
  sample_weight (rows, K))`, 0 for an empty slot.

Both streams keep `keras_vit.data.pipelines`' guarantees: every random draw is a
function of `(seed, position in the stream)`, so a run resumed at `start_batch=n` sees
the batches an uninterrupted run sees, and a file that fails to decode takes another
image of its batch's place (training) or is left out (evaluation).
"""

import math

import numpy as np
import tensorflow as tf

from keras_vit.data.augment import (
    PositionSeeds,
    augment_image,
    augmentation_layers,
    seed_from_stream,
    stream_layers,
)
from keras_vit.data.decode import decode_crop, full_window, resize
from keras_vit.data.naflex import check_layout, naflex_size, pack_rows
from keras_vit.data.pipelines import (
    decoded_or_flagged,
    decoded_rows,
    ordered_stream,
    readable_records,
    shard,
)
from keras_vit.data.sources import AUTOTUNE
from keras_vit.models.preprocessing import normalize
from keras_vit.utils.tf_data import without_autotuning


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


def naflex_batch(patches, grids, labels, buckets, packing=None):
    """A batch of images' patches `(images, longest, P*P*C)` (padded to the longest),
    their grids and one-hot labels to the model's batch: padded to the smallest of
    `buckets` holding the longest image, or with `packing` `(rows, row_tokens, K)` packed
    (`pack_rows`), labels `(rows, K, classes)` and sample weights `(rows, K)`."""
    lengths = grids[:, 0] * grids[:, 1]
    if packing is not None:
        rows, row_tokens, slots = packing

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
    bucket_counts = tf.constant(buckets, tf.int32)
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


def naflex_train_dataset(
    source,
    batch_size,
    *,
    patch_size,
    max_num_patches,
    buckets=None,
    images_per_row=None,
    row_tokens=None,
    channels=3,
    seed=0,
    inception_crop=True,
    crop_area=(0.05, 1.0),
    aspect_ratio=(3 / 4, 4 / 3),
    random_flip=True,
    augment="none",
    randaugment=None,
    mixup=None,
    cutmix=None,
    layers=(),
    shuffle_buffer=None,
    cache=False,
    start_batch=0,
    input_context=None,
    preprocessing=None,
):
    """The NaFlex training stream: endless, shuffled, augmented batches, each image at
    its own aspect ratio (the module's docstring gives the layouts).

    Args:
        source: a `Source` (see `load_source`).
        batch_size: images per global batch (packed: packed into
            `ceil(batch_size / images_per_row)` rows; an image that fits in no row is
            left out of its batch).
        patch_size: the model's patch size.
        max_num_patches: the token budget of each image.
        buckets: padded batches' token counts besides `max_num_patches`.
        images_per_row: the images of a packed row (K); None: padded batches.
        row_tokens: a packed row's tokens (default `images_per_row * max_num_patches`).
        channels, seed, crop_area, aspect_ratio, random_flip, augment, randaugment,
            mixup, cutmix, layers, shuffle_buffer, cache, start_batch, input_context,
            preprocessing: as `keras_vit.data.pipelines.train_dataset`'s;
            `inception_crop` draws its aspect ratio relative to the image's
            (`native_crop_window`); `layers` are applied to each image alone, at its
            size. MixUp and CutMix do not apply to images of different sizes:
            `ValueError` if either is on (an `augment` level's MixUp too, unless
            `mixup=0`).

    Example:

    >>> from keras_vit.data.sources import load_source
    >>> stream = naflex_train_dataset(load_source("digits"), 4, patch_size=4,
    ...                               max_num_patches=16, channels=1)
    >>> x, labels = next(iter(stream))
    >>> tuple(x["patches"].shape), tuple(x["spatial_shapes"].shape), tuple(labels.shape)
    ((4, 16, 16), (4, 2), (4, 10))
    """
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels!r}.")
    buckets, row_tokens = check_layout(max_num_patches, buckets, images_per_row, row_tokens)
    per_image, per_batch = augmentation_layers(augment, randaugment, mixup, cutmix)
    if per_batch:
        names = ", ".join(type(layer).__name__ for layer in per_batch)
        raise ValueError(
            f"NaFlex batches hold images of different sizes: {names} cannot mix them; set "
            "mixup and cutmix to 0 (an augment level sets MixUp)."
        )
    extra_image, extra_batch = stream_layers(layers)
    per_image = per_image + extra_image + extra_batch  # each image alone, at its size
    seeds = PositionSeeds()
    seed_from_stream(per_image, seeds)
    if shuffle_buffer is None:
        shuffle_buffer = min(source.size, 10_000) if source.name.startswith("tfds:") else source.size
    records, read, name = readable_records(source, cache)
    stream = ordered_stream(records, source.size, shuffle_buffer, seed, start_batch * batch_size)
    stream, pipelines = shard(stream, input_context)
    if batch_size % pipelines:
        raise ValueError(
            f"batch_size {batch_size} is not divisible by the {pipelines} input pipelines."
        )
    local_batch = input_context.get_per_replica_batch_size(batch_size) if input_context else batch_size
    packing = None
    if images_per_row is not None:
        packing = (-(-local_batch // images_per_row), row_tokens, images_per_row)

    def prepare(index, key, label):
        element_seed = tf.random.experimental.stateless_fold_in([seed, 0], index)
        crop_seed, flip_seed, layer_seed = tf.unstack(
            tf.random.experimental.stateless_split(element_seed, 3)
        )
        window = native_crop_window(crop_seed, crop_area, aspect_ratio) if inception_crop else full_window
        image = tf.ensure_shape(decode_crop(read(key), source.encoded, channels, window),
                                [None, None, channels])
        image = resize_native(image, patch_size, max_num_patches)
        if random_flip:
            image = tf.image.stateless_random_flip_left_right(image, flip_seed)
        with seeds.at(layer_seed):
            for layer in per_image:
                image = augment_image(layer, image, seeds)
        image = normalize(tf.clip_by_value(image, 0.0, 255.0), preprocessing)
        return patchify(image, patch_size), tf.one_hot(label, source.num_classes, dtype=tf.float32)

    def batch(images, labels, decoded):
        rows = decoded_rows(decoded)
        patches, grids = tf.gather(images[0], rows), tf.gather(images[1], rows)
        return naflex_batch(patches, grids, tf.gather(labels, rows), buckets, packing)

    prepared = decoded_or_flagged(stream, prepare, source, channels, read, name,
                                  blank_image(patch_size, channels))
    return without_autotuning(
        padded_images(prepared, local_batch, patch_size, channels, drop_remainder=True)
        .map(batch, num_parallel_calls=AUTOTUNE, deterministic=True)
        .prefetch(AUTOTUNE)
    )


def naflex_eval_dataset(
    source,
    batch_size,
    *,
    patch_size,
    max_num_patches,
    buckets=None,
    images_per_row=None,
    row_tokens=None,
    channels=3,
    cache=False,
    input_context=None,
    preprocessing=None,
):
    """One pass over `source`, each whole image resized, its aspect kept, to the largest
    grid within `max_num_patches` and normalised (`naflex_inputs`' patches, by
    TensorFlow's resize), in the layout of `naflex_train_dataset` (packed: one row per
    image at most, so every image counts). The last batch may be smaller; files that
    fail to decode are left out.

    Example:

    >>> from keras_vit.data.sources import load_source
    >>> test = naflex_eval_dataset(load_source("digits", "test"), 100, patch_size=4,
    ...                            max_num_patches=16, channels=1)
    >>> sum(int(x["patches"].shape[0]) for x, _ in test)
    360
    """
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels!r}.")
    buckets, row_tokens = check_layout(max_num_patches, buckets, images_per_row, row_tokens)
    records, _ = shard(source.records, input_context)
    local_batch = input_context.get_per_replica_batch_size(batch_size) if input_context else batch_size
    packing = None if images_per_row is None else (local_batch, row_tokens, images_per_row)
    _, read, name = readable_records(source, cache=False)

    def prepare(position, key, label):
        image = tf.ensure_shape(decode_crop(read(key), source.encoded, channels, full_window),
                                [None, None, channels])
        image = normalize(resize_native(image, patch_size, max_num_patches), preprocessing)
        return patchify(image, patch_size), tf.one_hot(label, source.num_classes, dtype=tf.float32)

    dataset = decoded_or_flagged(records.enumerate(), prepare, source, channels, read, name,
                                 blank_image(patch_size, channels))
    count = tf.get_static_value(records.cardinality())
    if count is not None and count >= 0:  # one element a record: Keras knows the pass's end
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(count))
    if cache:
        dataset = dataset.cache()

    def kept(images, labels, decoded):
        patches, grids = tf.boolean_mask(images[0], decoded), tf.boolean_mask(images[1], decoded)
        return naflex_batch(patches, grids, tf.boolean_mask(labels, decoded), buckets, packing)

    return without_autotuning(
        padded_images(dataset, local_batch, patch_size, channels, drop_remainder=False)
        .map(kept, num_parallel_calls=AUTOTUNE)
        .prefetch(AUTOTUNE)
    )
