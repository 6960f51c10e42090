"""Input pipelines (`tf.data`, TensorFlow-only): image sources and the paper's preprocessing.

A *source* is where labelled images come from: scikit-learn's digits (built in, no
network), a TensorFlow Datasets name, or a folder with one sub-folder per class. The
pipelines turn a source into batches of `(images in [-1, 1], one-hot labels)` with static
shapes, ready for `model.fit`:

- `train_dataset`: an endless, seeded stream: shuffle -> decode -> inception crop ->
  resize -> random flip -> RandAugment -> batch -> extra Keras layers -> MixUp / CutMix
  -> scale to [-1, 1]. Every random draw is a function of `(seed, position in the
  stream)`, so a run restarted at step `n` (`start_batch=n`) sees exactly the batches an
  uninterrupted run sees, and each worker of a multi-worker run reads its own share.
- `eval_dataset`: one pass, resize + central crop.
"""

import contextlib
import dataclasses
import functools
import logging
import os
import random
from typing import Callable, Optional

import keras
import numpy as np
import tensorflow as tf

from keras_vit.models.vit import preprocess

logger = logging.getLogger("keras_vit")

AUTOTUNE = tf.data.AUTOTUNE
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
# Split folders recognised inside an image folder (train/ plus one of the others).
EVAL_SPLIT_FOLDERS = ("val", "validation", "test")

# AugReg levels (Steiner et al. 2021, big_vision configs/vit_i21k.py):
# name -> ((RandAugment num_ops, magnitude) or None, MixUp alpha or None).
AUGREG_LEVELS = {
    "none": (None, None),
    "light1": ((2, 0), None),
    "light2": ((2, 10), 0.2),
    "medium1": ((2, 15), 0.2),
    "medium2": ((2, 15), 0.5),
    "strong1": ((2, 20), 0.5),
    "strong2": ((2, 20), 0.8),
}
# RandAugment magnitudes are on the 0-30 scale of the RandAugment paper; Keras' layer
# takes a strength in [0, 1].
RANDAUGMENT_MAX_MAGNITUDE = 30.0


class NoSplitError(ValueError):
    """A source has no split of the requested name (e.g. a folder without `test/`)."""


@dataclasses.dataclass
class Source:
    """Labelled images, before preprocessing.

    Attributes:
        name: the source specification it was loaded from.
        records: a `tf.data.Dataset` of `(key, label)`, cheap to shuffle (an index, a
            file path or an encoded record).
        read: maps a key to its payload: an encoded JPEG/PNG string when `encoded`,
            else a uint8 `(height, width, channels)` image.
        size: number of examples.
        num_classes: number of classes (labels are `0 .. num_classes - 1`).
        encoded: whether payloads are encoded files.
        class_names: names of the classes, when the source has them.
        skipped: files left out because they could not be decoded.
    """

    name: str
    records: tf.data.Dataset
    size: int
    num_classes: int
    encoded: bool
    read: Callable = tf.identity
    class_names: Optional[list] = None
    skipped: list = dataclasses.field(default_factory=list)


def load_source(spec, split="train", *, strict=False):
    """Loads a labelled image source.

    Args:
        spec: `"digits"` (scikit-learn's 8x8 digits, 1437 train / 360 test images,
            built in), `"tfds:NAME"` or `"tfds:NAME:SPLIT"` (any TensorFlow Datasets
            split, slicing included, e.g. `"tfds:imagenet2012:train[:99%]"`), or a
            folder with one sub-folder of JPEG/PNG files per class (optionally inside
            `train/` and `val/`, `validation/` or `test/` split folders). A split
            written in `spec` wins over `split`.
        split: `"train"` or `"test"` (for TFDS any split name; `"test"` falls back to
            `"validation"` when a dataset has no test split).
        strict: raise on files that cannot be decoded instead of skipping them.

    Example:

    >>> source = load_source("digits", "test")
    >>> source.size, source.num_classes
    (360, 10)
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(
            f"Data source must be 'digits', 'tfds:NAME[:SPLIT]' or a folder path, got {spec!r}."
        )
    if spec == "digits" or spec.startswith("digits:"):
        return _digits(spec_split(spec) or split)
    if spec.startswith("tfds:"):
        name = spec[len("tfds:"):].partition(":")[0]
        return _tfds(name, spec_split(spec) or split)
    if tf.io.gfile.isdir(spec):
        return _folder(spec, split, strict=strict)
    raise ValueError(
        f"Data source {spec!r} is not 'digits', 'tfds:NAME[:SPLIT]' or an existing folder."
    )


def spec_split(spec):
    """The split written into a source specification, or None.

    Example:

    >>> spec_split("tfds:imagenet2012:train[:99%]"), spec_split("digits")
    ('train[:99%]', None)
    """
    if spec.startswith("tfds:"):
        return spec[len("tfds:"):].partition(":")[2] or None
    if spec.startswith("digits:"):
        return spec.partition(":")[2]
    return None


def parse_classes(classes):
    """The class labels a class selection names, sorted: `"0-4"`, `"0,2,5-7"` or integers.

    Example:

    >>> parse_classes("5-9"), parse_classes("0,3-4"), parse_classes([7, 2])
    ((5, 6, 7, 8, 9), (0, 3, 4), (2, 7))
    """
    expected = "class labels like '0-4', '0,2,5-7' or a list of integers"
    if isinstance(classes, str):
        labels = set()
        for part in classes.replace(" ", "").split(","):
            low, dash, high = part.partition("-")
            if not (low.isdigit() and (not dash or high.isdigit())) or (dash and int(high) < int(low)):
                raise ValueError(f"classes must be {expected}, got {classes!r} (bad part {part!r}).")
            labels.update(range(int(low), int(high if dash else low) + 1))
    else:
        try:
            labels = set(classes)
        except TypeError:
            labels = None
        if labels is None or any(
            not isinstance(c, (int, np.integer)) or isinstance(c, bool) or c < 0 for c in labels
        ):
            raise ValueError(f"classes must be {expected}, got {classes!r}.")
    if len(labels) < 2:
        raise ValueError(f"classes={classes!r} selects {len(labels)} class(es): expected at least 2.")
    return tuple(sorted(int(c) for c in labels))


def select_classes(source, classes):
    """`source` restricted to some of its classes, relabelled `0 .. len(classes) - 1`.

    `classes` is anything `parse_classes` reads; label `classes[i]` becomes `i`, so a
    model trained on a selection has one output per selected class. Counting the
    selection reads the source's records once.

    Example:

    >>> upper = select_classes(load_source("digits", "test"), "5-9")
    >>> upper.size, upper.num_classes, upper.class_names
    (180, 5, ['5', '6', '7', '8', '9'])
    """
    labels = parse_classes(classes)
    outside = [c for c in labels if c >= source.num_classes]
    if outside:
        raise ValueError(
            f"classes={classes!r} names class(es) {outside} that {source.name} does not have: "
            f"its labels are 0-{source.num_classes - 1}."
        )
    relabel = np.full(source.num_classes, -1, "int32")
    relabel[list(labels)] = np.arange(len(labels))
    relabel = tf.constant(relabel)
    records = source.records.filter(lambda key, label: tf.gather(relabel, label) >= 0).map(
        lambda key, label: (key, tf.gather(relabel, label))
    )
    size = int(records.map(lambda key, label: label).reduce(0, lambda count, _: count + 1))
    # A known length: Keras then reads an eval pass to its end without a warning.
    records = records.apply(tf.data.experimental.assert_cardinality(size))
    names = source.class_names and [source.class_names[c] for c in labels]
    return dataclasses.replace(
        source,
        name=f"{source.name}[classes {','.join(map(str, labels))}]",
        records=records,
        size=size,
        num_classes=len(labels),
        class_names=names,
    )


def _digits(split):
    """scikit-learn's digits: 8x8 grey levels 0-16, scaled to uint8 0-255, one channel."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if split not in ("train", "test"):
        raise NoSplitError(f"The digits source has splits 'train' and 'test', got {split!r}.")
    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype("uint8")[..., None]
    parts = train_test_split(
        images, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    images, labels = (parts[0], parts[2]) if split == "train" else (parts[1], parts[3])
    records = tf.data.Dataset.from_tensor_slices((images, labels.astype("int32")))
    return Source(
        name=f"digits:{split}",
        records=records,
        size=len(labels),
        num_classes=10,
        encoded=False,
        class_names=[str(d) for d in range(10)],
    )


def _tfds(name, split):
    import tensorflow_datasets as tfds

    builder = tfds.builder(name)
    builder.download_and_prepare()
    info = builder.info
    if split == "test" and "test" not in info.splits:
        split = "validation"
    if split.split("[")[0] not in info.splits:
        raise NoSplitError(
            f"TFDS dataset {name!r} has no split {split!r}; it has {', '.join(info.splits)}."
        )
    image_key, label_key = info.supervised_keys or ("image", "label")
    if image_key not in info.features or label_key not in info.features:
        raise ValueError(
            f"TFDS dataset {name!r} has no ({image_key!r}, {label_key!r}) features: "
            "keras-vit needs an image classification dataset."
        )
    # Images stay encoded: the train pipeline decodes only the crop it needs.
    dataset = builder.as_dataset(
        split=split,
        decoders={image_key: tfds.decode.SkipDecoding()},
        shuffle_files=False,
    )
    records = dataset.map(
        lambda ex: (ex[image_key], tf.cast(ex[label_key], tf.int32)),
        num_parallel_calls=AUTOTUNE,
    )
    label = info.features[label_key]
    return Source(
        name=f"tfds:{name}:{split}",
        records=records,
        size=int(info.splits[split].num_examples),
        num_classes=int(label.num_classes),
        encoded=True,
        class_names=list(label.names),
    )


def _list_class_folder(root):
    classes = sorted(
        entry.rstrip("/")
        for entry in tf.io.gfile.listdir(root)
        if tf.io.gfile.isdir(os.path.join(root, entry))
    )
    paths, labels = [], []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        for file in sorted(tf.io.gfile.listdir(folder)):
            if file.lower().endswith(IMAGE_EXTENSIONS):
                paths.append(os.path.join(folder, file))
                labels.append(label)
    return classes, paths, labels


def _folder(root, split, *, strict):
    entries = {e.rstrip("/") for e in tf.io.gfile.listdir(root)}
    eval_folders = [name for name in EVAL_SPLIT_FOLDERS if name in entries]
    if "train" in entries and eval_folders:
        folder = os.path.join(root, "train" if split == "train" else eval_folders[0])
    elif split == "train":
        folder = root
    else:
        raise NoSplitError(
            f"Folder {root!r} has no {split!r} split: it would need train/ beside one of "
            f"{', '.join(f'{name}/' for name in EVAL_SPLIT_FOLDERS)}."
        )
    classes, paths, labels = _list_class_folder(folder)
    if len(classes) < 2 or not paths:
        raise ValueError(
            f"Image folder {folder!r} needs one sub-folder per class (at least 2) holding "
            f"{'/'.join(IMAGE_EXTENSIONS)} files; found {len(classes)} class folders and "
            f"{len(paths)} images."
        )
    good = find_decodable(paths)
    skipped = [path for i, path in enumerate(paths) if i not in good]
    if skipped:
        listing = "\n  ".join(skipped)
        message = (
            f"{len(skipped)} of {len(paths)} files in {folder!r} could not be decoded:\n  "
            f"{listing}"
        )
        if strict:
            raise ValueError(message + "\n(strict data mode; fix or remove these files)")
        logger.warning("Skipping %s", message)
        keep = sorted(good)
        paths = [paths[i] for i in keep]
        labels = [labels[i] for i in keep]
    records = tf.data.Dataset.from_tensor_slices(
        (tf.constant(paths), tf.constant(labels, tf.int32))
    )
    return Source(
        name=folder,
        records=records,
        size=len(paths),
        num_classes=len(classes),
        encoded=True,
        read=tf.io.read_file,
        class_names=classes,
        skipped=skipped,
    )


def find_decodable(paths):
    """Returns the set of indices of `paths` that hold a decodable JPEG or PNG.

    Decodes every file once, in parallel; files that fail are what a training run
    would otherwise crash on in the middle of an epoch.

    Example:

    >>> find_decodable([])
    set()
    """
    if not paths:
        return set()

    def check(index, path):
        image = tf.io.decode_image(tf.io.read_file(path), expand_animations=False)
        return index, tf.shape(image)  # The shape keeps the decode from being pruned.

    indices = (
        tf.data.Dataset.from_tensor_slices((tf.range(len(paths)), tf.constant(paths)))
        .map(check, num_parallel_calls=AUTOTUNE)
        .ignore_errors()
    )
    return {int(i) for i, _ in indices.as_numpy_iterator()}


# --- decoding and geometry ----------------------------------------------------------


def _to_channels(image, channels):
    have = image.shape[-1]
    if have == channels:
        return image
    if have == 1 and channels == 3:
        return tf.image.grayscale_to_rgb(image)
    if have in (3, 4) and channels == 1:
        return tf.image.rgb_to_grayscale(image[..., :3])
    if have == 4 and channels == 3:
        return image[..., :3]
    raise ValueError(f"Cannot convert {have}-channel images to {channels} channels.")


def _decode_crop(payload, encoded, channels, window_fn):
    """Decodes `payload` and cuts the window `window_fn(shape) -> (offset, size)`.

    JPEGs are decoded only inside the window (`decode_and_crop_jpeg`), which is what
    makes inception crops cheap at 224 px.
    """
    if not encoded:
        image = _to_channels(payload, channels)
        offset, size = window_fn(tf.shape(image))
        return tf.slice(image, offset, size)

    def jpeg():
        offset, size = window_fn(tf.image.extract_jpeg_shape(payload))
        window = tf.stack([offset[0], offset[1], size[0], size[1]])
        return tf.image.decode_and_crop_jpeg(payload, window, channels=channels)

    def other():
        image = tf.io.decode_image(payload, channels=channels, expand_animations=False)
        offset, size = window_fn(tf.shape(image))
        return tf.slice(image, offset, size)

    image = tf.cond(tf.io.is_jpeg(payload), jpeg, other)
    image.set_shape([None, None, channels])
    return image


def inception_crop_window(seed, area_range=(0.05, 1.0), aspect_ratio_range=(3 / 4, 4 / 3)):
    """A `window_fn` drawing the inception crop: a random window covering
    `area_range` of the image with aspect ratio in `aspect_ratio_range`.

    Example:

    >>> offset, size = inception_crop_window([0, 1])(tf.constant([32, 32, 3]))
    >>> int(size[2])
    -1
    """

    def window(shape):
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape,
            bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
            seed=seed,
            min_object_covered=0.0,
            aspect_ratio_range=aspect_ratio_range,
            area_range=area_range,
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        return begin, size

    return window


def _full_window(shape):
    return tf.zeros([3], tf.int32), tf.stack([shape[0], shape[1], -1])


def _resize(image, image_size, channels):
    image = tf.image.resize(image, (image_size, image_size), method="bilinear")
    image.set_shape([image_size, image_size, channels])
    return image


def central_crop(image, image_size, crop_fraction):
    """Resizes the short side to `image_size / crop_fraction`, then cuts the central
    `image_size` square: the eval preprocessing (big_vision's resize_small + central_crop).
    `image` is one image `(height, width, channels)` or a batch of images of one size.

    Example:

    >>> tuple(central_crop(tf.zeros((48, 64, 3)), 32, 0.875).shape)
    (32, 32, 3)
    """
    shape = tf.cast(tf.shape(image)[-3:-1], tf.float32)
    scale = (image_size / crop_fraction) / tf.reduce_min(shape)
    resized = tf.maximum(tf.cast(tf.round(shape * scale), tf.int32), image_size)
    image = tf.image.resize(image, resized, method="bilinear")
    top = (resized[0] - image_size) // 2
    left = (resized[1] - image_size) // 2
    image = image[..., top : top + image_size, left : left + image_size, :]
    image.set_shape(image.shape[:-3].concatenate([image_size, image_size, image.shape[-1]]))
    return image


def eval_resize(images, size, crop_fraction=None):
    """Images (one, or a batch of one size) brought to the model's `size`, as float32.

    `crop_fraction=None` resizes the whole image (bilinear), as the official vit_jax
    evaluation does for its checkpoints; a fraction in (0, 1] takes the `central_crop`
    of the engine's `eval_dataset` (a run's `eval_crop_fraction`), for square sizes.

    Example:

    >>> tuple(eval_resize(tf.zeros((2, 48, 64, 3)), (32, 32)).shape)
    (2, 32, 32, 3)
    """
    height, width = check_crop_fraction(crop_fraction, size)
    images = tf.cast(images, tf.float32)
    if crop_fraction is None:
        return tf.image.resize(images, (height, width), method="bilinear")
    return central_crop(images, height, crop_fraction)


def check_crop_fraction(crop_fraction, size):
    """Raises `ValueError` unless `eval_resize` takes `crop_fraction` for `size` (an int
    or `(height, width)`); returns `(height, width)`."""
    height, width = (size, size) if isinstance(size, int) else size
    if crop_fraction is None:
        return height, width
    if not 0 < crop_fraction <= 1:
        raise ValueError(f"crop_fraction must be in (0, 1] or None, got {crop_fraction!r}.")
    if height != width:
        raise ValueError(
            f"A central crop (crop_fraction={crop_fraction}) needs a square model input, "
            f"got {height}x{width}; use crop_fraction=None to resize whole images."
        )
    return height, width


def read_images(paths, image_size, *, channels=3, crop_fraction=None):
    """Image files as one batch of model inputs, `(len(paths), size, size, channels)`.

    Decoded (JPEG, PNG, GIF, BMP), brought to `image_size` by `eval_resize` (the whole
    image, or a run's central crop) and scaled to [-1, 1]. A missing or undecodable
    file is an error naming it.

    Example:

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "grey.png")
    >>> tf.io.write_file(path, tf.io.encode_png(tf.fill([20, 30, 3], tf.constant(255, tf.uint8))))
    >>> read_images([path], 16).shape
    (1, 16, 16, 3)
    """
    images = []
    for path in paths:
        if not tf.io.gfile.exists(path):
            raise FileNotFoundError(f"No such image file: {path!r}.")
        try:
            image = _decode_crop(tf.io.read_file(path), True, channels, _full_window)
        except tf.errors.InvalidArgumentError:
            raise ValueError(f"{path!r} is not a JPEG, PNG, GIF or BMP image.") from None
        images.append(eval_resize(image, image_size, crop_fraction))
    return keras.ops.convert_to_numpy(preprocess(tf.stack(images).numpy()))


# --- augmentation --------------------------------------------------------------------


class _PositionSeeds(keras.random.SeedGenerator):
    """Seeds for Keras augmentation layers inside `tf.data`, drawn from the stream position.

    A Keras layer's own `SeedGenerator` is a variable that each call advances: in a
    parallel `map` its draws depend on scheduling, and after a restart they start over.
    While `at(seed)` is active (during tracing of the map function), each draw is
    `fold_in(seed, k)` for the k-th draw, with `seed` the element's (or batch's) own
    stateless seed: augmentations become a pure function of the position in the stream.
    """

    def __init__(self):  # No state variable: seeds come from the stream.
        self.name = "position_seeds"
        self._seed = None
        self._draws = 0

    @contextlib.contextmanager
    def at(self, seed):
        self._seed, self._draws = seed, 0
        try:
            yield
        finally:
            self._seed = None

    def next(self, ordered=True):
        if self._seed is None:
            raise RuntimeError("Augmentation layers drew a seed outside the input pipeline.")
        self._draws += 1
        return tf.random.experimental.stateless_fold_in(self._seed, self._draws)


def _seed_from_stream(layers, seeds):
    """Makes `layers` (and their sub-layers) draw randomness from `seeds`."""
    for layer in layers:
        for sub in layer._flatten_layers(include_self=True):
            if hasattr(sub, "generator"):
                # object.__setattr__: keep Keras from tracking a stateless generator.
                object.__setattr__(sub, "generator", seeds)
                object.__setattr__(sub, "_backend_generators", {"tensorflow": seeds})


def _rand_augment(layer, image, seeds):
    """Keras' RandAugment on one image, running only the operations it picks.

    `keras.layers.RandAugment` computes every one of its operations and keeps the picked
    ones with `where`; picking with `switch_case` runs `num_ops` of them, the same
    operations at the same strength, at a fraction of the cost.
    """
    names = layer._AUGMENT_LAYERS
    for _ in range(layer.num_ops):
        pick = tf.random.stateless_uniform([], seeds.next(), 0, len(names), dtype=tf.int32)
        branches = [functools.partial(getattr(layer, name), image) for name in names]
        image = tf.switch_case(pick, branches)
    return image


def _augment_image(layer, image, seeds):
    if isinstance(layer, keras.layers.RandAugment):
        return _rand_augment(layer, image, seeds)
    return layer(image)


def augmentation_layers(augment="none", randaugment=None, mixup=None, cutmix=None):
    """Returns `(per_image_layers, per_batch_layers)` of Keras augmentation layers.

    Args:
        augment: an AugReg level, one of `AUGREG_LEVELS` (`"none"`, `"light1"` ...
            `"strong2"`); it sets RandAugment and MixUp unless given below.
        randaugment: `(num_ops, magnitude)`, magnitude on the paper's 0-30 scale.
        mixup: MixUp's Beta alpha.
        cutmix: CutMix's Beta alpha (Keras' `factor`).

    Example:

    >>> image_layers, batch_layers = augmentation_layers("light2")
    >>> [type(layer).__name__ for layer in image_layers + batch_layers]
    ['RandAugment', 'MixUp']
    """
    if augment not in AUGREG_LEVELS:
        raise ValueError(
            f"Unknown augmentation level {augment!r}: expected one of "
            f"{', '.join(map(repr, AUGREG_LEVELS))}."
        )
    level_randaugment, level_mixup = AUGREG_LEVELS[augment]
    randaugment = level_randaugment if randaugment is None else randaugment
    mixup = level_mixup if mixup is None else mixup
    per_image, per_batch = [], []
    if randaugment is not None:
        if len(randaugment) != 2 or not 0 <= randaugment[1] <= RANDAUGMENT_MAX_MAGNITUDE:
            raise ValueError(
                f"randaugment must be (num_ops, magnitude) with magnitude in 0-30, "
                f"got {randaugment!r}."
            )
        num_ops, magnitude = randaugment
        per_image.append(
            keras.layers.RandAugment(
                value_range=(0, 255),
                num_ops=int(num_ops),
                factor=magnitude / RANDAUGMENT_MAX_MAGNITUDE,
                dtype="float32",
            )
        )
    if mixup:
        per_batch.append(keras.layers.MixUp(alpha=float(mixup), dtype="float32"))
    if cutmix:
        per_batch.append(keras.layers.CutMix(factor=float(cutmix), dtype="float32"))
    return per_image, per_batch


def as_layer(layer):
    """A Keras layer from a layer or its serialized form (`keras.layers.serialize`).

    Example:

    >>> type(as_layer({"class_name": "RandomTranslation",
    ...                 "config": {"height_factor": 0.1, "width_factor": 0.1}})).__name__
    'RandomTranslation'
    """
    if isinstance(layer, keras.layers.Layer):
        return layer
    if isinstance(layer, dict):
        # A new layer without a seed draws one from Python's `random`; that draw must not
        # move the run's seeded stream (the model is initialised after the pipeline is
        # made), and the layer's seed is unused: `_seed_from_stream` replaces it.
        state = random.getstate()
        try:
            # Keras finds its own classes through the module, which hand-written configs omit.
            return keras.layers.deserialize({"module": "keras.layers", **layer})
        except (TypeError, ValueError) as error:
            raise ValueError(f"Augmentation {layer!r} is not a Keras layer: {error}") from None
        finally:
            random.setstate(state)
    raise ValueError(
        f"Augmentations must be Keras layers or their serialized dicts, got {layer!r}."
    )


# --- pipelines -------------------------------------------------------------------------


def _rescale():
    # A Keras layer, so the scaling runs in tf.data whatever the Keras backend.
    return keras.layers.Rescaling(1.0 / 127.5, offset=-1.0, dtype="float32")


def _shard(dataset, input_context):
    if input_context is None or input_context.num_input_pipelines == 1:
        return dataset, 1
    return (
        dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id),
        input_context.num_input_pipelines,
    )


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
):
    """The training stream: endless, shuffled, augmented batches.

    Yields `(images, labels)`: float32 images `(batch, image_size, image_size, channels)`
    in [-1, 1] and float32 one-hot (or MixUp/CutMix-mixed) labels `(batch, classes)`.

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
        layers: more Keras preprocessing layers (or their serialized dicts), applied to
            each batch of [0, 255] images before MixUp/CutMix.
        shuffle_buffer: shuffle buffer (default: the whole source, at most 10,000
            encoded TFDS records).
        cache: keep the source's records (the file bytes) in memory after the first pass.
        start_batch: start at this batch of the stream (used to resume a run).
        input_context: a `tf.distribute.InputContext`; the stream is then shared among
            the input pipelines element by element, so together they yield exactly the
            global batches of a single-pipeline stream.

    Example:

    >>> stream = train_dataset(load_source("digits"), image_size=16, batch_size=8, channels=1)
    >>> images, labels = next(iter(stream))
    >>> tuple(images.shape), tuple(labels.shape)
    ((8, 16, 16, 1), (8, 10))
    """
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels!r}.")
    per_image, per_batch = augmentation_layers(augment, randaugment, mixup, cutmix)
    per_batch = [as_layer(layer) for layer in layers] + per_batch
    seeds = _PositionSeeds()
    _seed_from_stream(per_image + per_batch, seeds)
    rescale = _rescale()
    num_classes = source.num_classes
    if shuffle_buffer is None:
        shuffle_buffer = min(source.size, 10_000) if source.name.startswith("tfds:") else source.size

    records, read = source.records, source.read
    if cache:
        records = records.map(lambda key, label: (read(key), label)).cache()
        read = tf.identity
    stream = (
        records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        .repeat()
        .enumerate()
        .skip(start_batch * batch_size)
    )
    stream, pipelines = _shard(stream, input_context)
    if batch_size % pipelines:
        raise ValueError(
            f"batch_size {batch_size} is not divisible by the {pipelines} input pipelines."
        )
    if input_context is not None:
        local_batch = input_context.get_per_replica_batch_size(batch_size)
    else:
        local_batch = batch_size

    def prepare(index, record):
        key, label = record
        payload = read(key)
        element_seed = tf.random.experimental.stateless_fold_in([seed, 0], index)
        crop_seed, flip_seed, layer_seed = tf.unstack(
            tf.random.experimental.stateless_split(element_seed, 3)
        )
        if inception_crop:
            window = inception_crop_window(crop_seed, crop_area, aspect_ratio)
        else:
            window = _full_window
        image = _decode_crop(payload, source.encoded, channels, window)
        image = _resize(image, image_size, channels)
        if random_flip:
            image = tf.image.stateless_random_flip_left_right(image, flip_seed)
        with seeds.at(layer_seed):
            for layer in per_image:
                image = _augment_image(layer, image, seeds)
        image = tf.clip_by_value(image, 0.0, 255.0)
        image.set_shape([image_size, image_size, channels])
        return image, tf.one_hot(label, num_classes, dtype=tf.float32)

    def mix(batch_index, batch):
        images, labels = batch
        if per_batch:
            data = {"images": images, "labels": labels}
            batch_seed = tf.random.experimental.stateless_fold_in([seed, 1], batch_index)
            with seeds.at(batch_seed):
                for layer in per_batch:
                    data = layer(data)
            images = tf.clip_by_value(data["images"], 0.0, 255.0)
            labels = tf.cast(data["labels"], tf.float32)
        images = rescale(images)
        images.set_shape([local_batch, image_size, image_size, channels])
        labels.set_shape([local_batch, num_classes])
        return images, labels

    return (
        stream.map(prepare, num_parallel_calls=AUTOTUNE, deterministic=True)
        .batch(local_batch, drop_remainder=True)
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
):
    """One pass over `source`: `eval_resize` (by default a central crop), scaled to
    [-1, 1], one-hot labels.

    The last batch may be smaller, so every example counts once.

    Example:

    >>> test = eval_dataset(load_source("digits", "test"), 16, 100, channels=1, crop_fraction=1)
    >>> sum(int(images.shape[0]) for images, _ in test)
    360
    """
    check_crop_fraction(crop_fraction, image_size)
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels!r}.")
    rescale = _rescale()
    num_classes = source.num_classes
    records, _ = _shard(source.records, input_context)
    local_batch = (
        input_context.get_per_replica_batch_size(batch_size) if input_context else batch_size
    )

    def prepare(key, label):
        image = _decode_crop(source.read(key), source.encoded, channels, _full_window)
        image = eval_resize(image, image_size, crop_fraction)
        return image, tf.one_hot(label, num_classes, dtype=tf.float32)

    dataset = records.map(prepare, num_parallel_calls=AUTOTUNE)
    if cache:
        dataset = dataset.cache()
    return (
        dataset.batch(local_batch)
        .map(lambda images, labels: (rescale(images), labels), num_parallel_calls=AUTOTUNE)
        .prefetch(AUTOTUNE)
    )
