"""Input pipelines (`tf.data`, TensorFlow-only): a source to batches for `model.fit`.

The pipelines turn a `keras_vit.data.sources.Source` into batches of `(images in [-1, 1], one-hot labels)` with static
shapes, ready for `model.fit`:

- `train_dataset`: an endless, seeded stream: shuffle -> decode -> inception crop ->
  resize -> random flip -> RandAugment -> batch -> extra Keras layers -> MixUp / CutMix
  -> normalise (`preprocessing`: by default to [-1, 1]). Every random draw is a function of `(seed, position in the
  stream)`, so a run restarted at step `n` (`start_batch=n`) sees exactly the batches an
  uninterrupted run sees, and each worker of a multi-worker run reads its own share.
- `eval_dataset`: one pass, resize + central crop.

A file that passed the start-up check (`keras_vit.data.headers`) but fails to decode
(`decoded_or_flagged`) is named once in a warning and recorded in the source's
`undecodable`; the training stream puts another image of its batch in its place, so
every batch keeps its positions in the stream (a resumed run stays exact), and the
evaluation pass leaves it out. Both end in `without_autotuning`
(`keras_vit.utils.tf_data`).
"""

import logging
import re

import tensorflow as tf

from keras_vit.data.augment import (
    PositionSeeds,
    augment_image,
    augmentation_layers,
    seed_from_stream,
    stream_layers,
)
from keras_vit.data.decode import (
    check_crop_fraction,
    decode_crop,
    decode_pixels,
    eval_resize,
    full_window,
    inception_crop_window,
    resize_square,
)
from keras_vit.data.naflex_pipelines import (
    blank_image,
    naflex_batch,
    native_crop_window,
    padded_images,
    patchify,
    resize_native,
)
from keras_vit.data.sources import AUTOTUNE
from keras_vit.models.preprocessing import DEFAULT, check_preprocessing, normalize
from keras_vit.utils.tf_data import without_autotuning

logger = logging.getLogger("keras_vit")


def shard(dataset, input_context):
    """`(this pipeline's share of dataset, number of pipelines)` under `input_context`."""
    if input_context is None or input_context.num_input_pipelines == 1:
        return dataset, 1
    return (
        dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id),
        input_context.num_input_pipelines,
    )


def ordered_stream(records, size, shuffle_buffer, seed, start=0):
    """`records` repeated endlessly, each pass shuffled, as `(position, record)` from `start`.

    Pass `e` is shuffled with a seed drawn from `(seed, e)` alone, so the stream is a pure
    function of the seed: every iterator opened over it, in this process or after a
    restart, yields the same records at the same positions. (`shuffle`'s
    `reshuffle_each_iteration` draws each new iterator's order from a counter instead,
    so the order depended on how many iterators had been opened before.)

    Args:
        records: a `tf.data.Dataset` of exactly `size` elements.
        size: its number of elements (one pass).
        shuffle_buffer: the shuffle buffer of each pass.
        seed: the stream's seed.
        start: the first position yielded.

    Example:

    >>> stream = ordered_stream(tf.data.Dataset.range(5), 5, 5, seed=0, start=3)
    >>> [int(position) for position, _ in stream.take(4)]
    [3, 4, 5, 6]
    """
    first_pass, offset = divmod(int(start), int(size))

    def one_pass(index):
        # `shuffle` takes a tensor seed, but its helper compares the graph-level seed with
        # 0 in Python first: fixing this function graph's own seed (it applies nowhere
        # else) keeps that comparison off the tensor and the order out of the global
        # seed's reach.
        tf.random.set_seed(1)
        pass_seed = tf.random.stateless_uniform(
            [], tf.stack([tf.constant(seed, tf.int64), index]), minval=1, maxval=2**31 - 1,
            dtype=tf.int64,
        )
        shuffled = records.shuffle(shuffle_buffer, seed=pass_seed, reshuffle_each_iteration=False)
        return shuffled.enumerate(start=index * size)

    return tf.data.Dataset.counter(first_pass).flat_map(one_pass).skip(offset)


def readable_records(source, cache):
    """`(records, read, name)` of `source`: its records (the payloads kept in memory
    after the first pass with `cache`), the function from a record's key to its
    payload, and the one from a key to the file's name (None: no file, e.g. TFDS)."""
    records, read = source.records, source.read
    names_files = read is tf.io.read_file  # a folder: the keys are the paths
    if not cache:
        return records, read, (tf.identity if names_files else None)
    if not names_files:  # the payloads alone
        return records.map(lambda key, label: (read(key), label)).cache(), tf.identity, None
    records = records.map(lambda key, label: ((key, read(key)), label)).cache()
    return records, lambda key: key[1], lambda key: key[0]


def note_undecodable(source, channels, name, position, payload):
    """Records (and names once in a warning) the example at stream `position` whose
    `payload` failed to decode: its file `name` (empty for a source without files) in
    `source.undecodable`. With `source.strict` raises `ValueError` naming it instead.
    Runs in Python (`tf.py_function`), only for such examples."""
    name = name.numpy().decode() or f"the example at position {int(position)} of {source.name}"
    try:
        decode_pixels(payload, channels)
        reason = "its crop window failed to decode"
    except tf.errors.OpError as error:
        # The op's message without TensorFlow's function and op names around it.
        reason = re.sub(r"\{\{.*?\}\}|\[Op:.*", "", error.message.split("\n")[0])
        reason = " ".join(reason.split()) or error.__class__.__name__
    if source.strict:
        raise ValueError(f"{name} failed to decode: {reason} (strict data mode; fix or "
                         "remove this file)")
    if name not in source.undecodable:
        source.undecodable[name] = f"failed to decode ({reason})"
        logger.warning("Skipping %s: it failed to decode (%s); the run's summary lists it.",
                       name, reason)
    return False


def decoded_or_flagged(stream, prepare, source, channels, read, name, shape):
    """`stream` of `(position, (key, label))` mapped to `(image, one-hot label, True)` by
    `prepare(position, key, label)`, in order, or where that fails (a file that does not
    decode) to `(zeros of shape, one-hot label, False)` once `note_undecodable` has
    recorded the file: one element per position, so a failure shifts nothing. `shape`
    may instead be a function making the stand-in image (an image that is a structure
    of tensors, e.g. NaFlex patches and their grid).

    Each element of an encoded source is prepared in a dataset of its own (`interleave`
    with `deterministic=True`), whose errors `ignore_errors` drops; the flagged element is
    made only then. Pixels (not encoded) always decode and take a plain `map`, which
    costs less.
    """
    if not source.encoded:
        return stream.map(lambda position, record: (*prepare(position, *record), True),
                          num_parallel_calls=AUTOTUNE, deterministic=True)

    def flagged(position, key, label):
        ok = tf.py_function(
            lambda n, p, b: note_undecodable(source, channels, n, p, b),
            [name(key) if name else tf.constant(""), position, read(key)], tf.bool,
        )
        ok.set_shape([])
        blank = shape() if callable(shape) else tf.zeros(shape)
        return blank, tf.one_hot(label, source.num_classes, dtype=tf.float32), ok

    def one(position, record):
        element = tf.data.Dataset.from_tensors((position, *record))
        decoded = element.map(lambda *args: (*prepare(*args), True)).ignore_errors()
        return decoded.concatenate(element.map(flagged)).take(1)

    return stream.interleave(one, num_parallel_calls=AUTOTUNE, deterministic=True)


def decoded_rows(decoded):
    """The rows of a batch that stand in for its examples: each example's own, or for
    one that failed to decode (`decoded` False) the batch's first decoded one, so the
    batch keeps its size and its positions in the stream."""
    check = tf.debugging.Assert(
        tf.reduce_any(decoded), ["No image of a batch decoded (see the warnings)."]
    )
    with tf.control_dependencies([check]):
        first = tf.argmax(tf.cast(decoded, tf.int32), output_type=tf.int32)
    return tf.where(decoded, tf.range(tf.shape(decoded)[0]), first)


def train_dataset(
    source,
    image_size,
    batch_size,
    *,
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
    naflex=None,
):
    """The training stream: endless, shuffled, augmented batches.

    Yields `(images, labels)`: float32 images `(batch, image_size, image_size, channels)`
    in [-1, 1] and float32 one-hot (or MixUp/CutMix-mixed) labels `(batch, classes)`;
    with `naflex` the batches of a NaFlex model, each image at its own aspect
    (`keras_vit.data.naflex_pipelines`).

    Args:
        source: a `Source` (see `load_source`).
        image_size: output side length.
        batch_size: global batch size; with `input_context` each of its
            `num_input_pipelines` pipelines yields `batch_size / num_replicas_in_sync`.
        channels: 1 or 3; sources are converted (grey <-> RGB).
        seed: the stream is a pure function of the seed.
        inception_crop: random crop of `crop_area` of the image with aspect ratio in
            `aspect_ratio` (the paper's); False resizes the whole image.
        random_flip: random left-right flip.
        augment, randaugment, mixup, cutmix: see `augmentation_layers`.
        layers: more Keras or keras-cv preprocessing layers (or their serialized
            dicts), applied to [0, 255] images before MixUp/CutMix: to each batch, or
            to each image for keras-cv layers that draw per image (`draws_per_image`).
        shuffle_buffer: shuffle buffer (default: the whole source, at most 10,000
            encoded TFDS records).
        cache: keep the source's records (the file bytes) in memory after the first pass.
        start_batch: start at this batch of the stream (used to resume a run).
        input_context: a `tf.distribute.InputContext`; the stream is then shared among
            the input pipelines element by element, so together they yield exactly the
            global batches of a single-pipeline stream.
        preprocessing: the normalisation the model's weights expect
            (`keras_vit.models.preprocessing.normalize`); None scales to [-1, 1].
        naflex: a `keras_vit.data.naflex.NaFlexLayout`: NaFlex batches (`image_size`
            unused), padded or packed (then `batch_size` images are packed into
            `ceil(batch_size / images_per_row)` rows; one that fits in no row is left
            out). The inception crop draws its aspect ratio relative to the image's;
            `layers` apply to each image alone, at its size; MixUp and CutMix, which
            mix images of one size, are a `ValueError` (an `augment` level's MixUp
            too, unless `mixup=0`).

    Example:

    >>> from keras_vit.data.sources import load_source
    >>> stream = train_dataset(load_source("digits"), image_size=16, batch_size=8, channels=1)
    >>> images, labels = next(iter(stream))
    >>> tuple(images.shape), tuple(labels.shape)
    ((8, 16, 16, 1), (8, 10))
    >>> from keras_vit.data.naflex import NaFlexLayout
    >>> stream = train_dataset(load_source("digits"), None, 4, channels=1,
    ...                        naflex=NaFlexLayout(patch_size=4, max_num_patches=16))
    >>> x, labels = next(iter(stream))
    >>> tuple(x["patches"].shape), tuple(x["spatial_shapes"].shape), tuple(labels.shape)
    ((4, 16, 16), (4, 2), (4, 10))
    """
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels!r}.")
    per_image, per_batch = augmentation_layers(augment, randaugment, mixup, cutmix)
    extra_image, extra_batch = stream_layers(layers)
    if naflex is None:
        per_image, per_batch = per_image + extra_image, extra_batch + per_batch
    elif per_batch:
        names = ", ".join(type(layer).__name__ for layer in per_batch)
        raise ValueError(
            f"NaFlex batches hold images of different sizes: {names} cannot mix them; set "
            "mixup and cutmix to 0 (an augment level sets MixUp)."
        )
    else:  # each image alone, at its size
        per_image = per_image + extra_image + extra_batch
    seeds = PositionSeeds()
    seed_from_stream(per_image + per_batch, seeds)
    num_classes = source.num_classes
    if shuffle_buffer is None:
        shuffle_buffer = min(source.size, 10_000) if source.name.startswith("tfds:") else source.size

    records, read, name = readable_records(source, cache)
    stream = ordered_stream(records, source.size, shuffle_buffer, seed, start_batch * batch_size)
    stream, pipelines = shard(stream, input_context)
    if batch_size % pipelines:
        raise ValueError(
            f"batch_size {batch_size} is not divisible by the {pipelines} input pipelines."
        )
    if input_context is not None:
        local_batch = input_context.get_per_replica_batch_size(batch_size)
    else:
        local_batch = batch_size

    def prepare(index, key, label):
        payload = read(key)
        element_seed = tf.random.experimental.stateless_fold_in([seed, 0], index)
        crop_seed, flip_seed, layer_seed = tf.unstack(
            tf.random.experimental.stateless_split(element_seed, 3)
        )
        if inception_crop:
            crop = inception_crop_window if naflex is None else native_crop_window
            window = crop(crop_seed, crop_area, aspect_ratio)
        else:
            window = full_window
        image = decode_crop(payload, source.encoded, channels, window)
        if naflex is None:
            image = resize_square(image, image_size, channels)
        else:
            image = resize_native(tf.ensure_shape(image, [None, None, channels]),
                                  naflex.patch_size, naflex.max_num_patches)
        if random_flip:
            image = tf.image.stateless_random_flip_left_right(image, flip_seed)
        with seeds.at(layer_seed):
            for layer in per_image:
                image = augment_image(layer, image, seeds)
        image = tf.clip_by_value(image, 0.0, 255.0)
        label = tf.one_hot(label, num_classes, dtype=tf.float32)
        if naflex is not None:
            return patchify(normalize(image, preprocessing), naflex.patch_size), label
        image.set_shape([image_size, image_size, channels])
        return image, label

    def mix(batch_index, batch):
        images, labels, decoded = batch
        rows = decoded_rows(decoded)
        images, labels = tf.gather(images, rows), tf.gather(labels, rows)
        if per_batch:
            data = {"images": images, "labels": labels}
            batch_seed = tf.random.experimental.stateless_fold_in([seed, 1], batch_index)
            with seeds.at(batch_seed):
                for layer in per_batch:
                    data = layer(data)
            images = tf.clip_by_value(data["images"], 0.0, 255.0)
            labels = tf.cast(data["labels"], tf.float32)
        images = normalize(images, preprocessing)
        images.set_shape([local_batch, image_size, image_size, channels])
        labels.set_shape([local_batch, num_classes])
        return images, labels

    if naflex is not None:
        return without_autotuning(naflex_batches(
            decoded_or_flagged(stream, prepare, source, channels, read, name,
                               blank_image(naflex.patch_size, channels)),
            naflex, local_batch, channels, training=True,
        ))
    prepared = decoded_or_flagged(stream, prepare, source, channels, read, name,
                                  [image_size, image_size, channels])
    return without_autotuning(
        prepared.batch(local_batch, drop_remainder=True)
        .enumerate(start=start_batch)
        .map(mix, num_parallel_calls=AUTOTUNE, deterministic=True)
        .prefetch(AUTOTUNE)
    )


def eval_dataset(
    source,
    image_size,
    batch_size,
    *,
    channels=3,
    crop_fraction=0.875,
    cache=False,
    input_context=None,
    preprocessing=None,
    naflex=None,
):
    """One pass over `source`: `eval_resize` (by default a central crop) with the
    resize filter of `preprocessing`, normalised by it (None: scaled to [-1, 1]),
    one-hot labels. With `naflex` (a `keras_vit.data.naflex.NaFlexLayout`;
    `image_size` and `crop_fraction` unused) each whole image is resized, its aspect
    kept, to the largest grid within the budget (`naflex_inputs`' patches, by
    TensorFlow's resize), in the layout's batches (packed: one row per image at most,
    so that every image counts).

    The last batch may be smaller, so every example counts once.

    Example:

    >>> from keras_vit.data.sources import load_source
    >>> test = eval_dataset(load_source("digits", "test"), 16, 100, channels=1, crop_fraction=1)
    >>> sum(int(images.shape[0]) for images, _ in test)
    360
    """
    if naflex is None:
        height, width = check_crop_fraction(crop_fraction, image_size)
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels!r}.")
    checked = check_preprocessing(preprocessing or DEFAULT)
    method = checked["interpolation"], checked["antialias"]
    num_classes = source.num_classes
    records, _ = shard(source.records, input_context)
    local_batch = (
        input_context.get_per_replica_batch_size(batch_size) if input_context else batch_size
    )

    _, read, name = readable_records(source, cache=False)

    def prepare(position, key, label):
        image = decode_crop(read(key), source.encoded, channels, full_window)
        label = tf.one_hot(label, num_classes, dtype=tf.float32)
        if naflex is not None:
            image = resize_native(tf.ensure_shape(image, [None, None, channels]),
                                  naflex.patch_size, naflex.max_num_patches)
            return patchify(normalize(image, preprocessing), naflex.patch_size), label
        return eval_resize(image, image_size, crop_fraction, *method), label

    blank = [height, width, channels] if naflex is None else blank_image(naflex.patch_size, channels)
    dataset = decoded_or_flagged(records.enumerate(), prepare, source, channels, read, name, blank)
    count = tf.get_static_value(records.cardinality())
    if count is not None and count >= 0:  # one element a record: Keras knows the pass's end
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(count))
    if cache:
        dataset = dataset.cache()
    if naflex is not None:
        return without_autotuning(naflex_batches(dataset, naflex, local_batch, channels,
                                                 training=False))

    def kept(images, labels, decoded):
        # Files that failed to decode are left out of their batch (the batches keep
        # their number).
        images, labels = tf.boolean_mask(images, decoded), tf.boolean_mask(labels, decoded)
        return normalize(images, preprocessing), labels

    return without_autotuning(
        dataset.batch(local_batch)
        .map(kept, num_parallel_calls=AUTOTUNE)
        .prefetch(AUTOTUNE)
    )


def naflex_batches(prepared, layout, batch_size, channels, training):
    """The NaFlex batches (`naflex_batch`) of a stream of `((patches, grid), label,
    decoded)`: training batches of `batch_size` where an image that failed to decode
    takes the place of another (`decoded_rows`), packed into `ceil(batch_size / K)`
    rows; evaluation batches without it (the last one smaller), packed one row per
    image at most."""
    rows = batch_size
    if training and layout.images_per_row is not None:
        rows = -(-batch_size // layout.images_per_row)

    def batch(images, labels, decoded):
        if training:
            kept = decoded_rows(decoded)
            patches, grids, labels = (tf.gather(v, kept) for v in (*images, labels))
        else:
            patches, grids, labels = (tf.boolean_mask(v, decoded) for v in (*images, labels))
        return naflex_batch(patches, grids, labels, layout, rows)

    return (
        padded_images(prepared, batch_size, layout.patch_size, channels, drop_remainder=training)
        .map(batch, num_parallel_calls=AUTOTUNE, deterministic=True)
        .prefetch(AUTOTUNE)
    )
