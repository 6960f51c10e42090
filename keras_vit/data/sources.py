"""Image sources: where labelled images come from (TensorFlow-only).

A *source* is scikit-learn's digits (built in, no network), a TensorFlow Datasets name,
or a folder with one sub-folder per class; `load_source` returns it as a `Source`, a
cheap-to-shuffle `tf.data.Dataset` of `(key, label)` records plus a `read` function from
key to payload. `select_classes` keeps some of its classes.
"""

import dataclasses
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from keras_vit.data.folders import IMAGE_EXTENSIONS, load_listing
from keras_vit.data.libjpeg import BackgroundCheck
from keras_vit.digits import SPLITS, digits_arrays
from keras_vit.utils.paths import is_url

logger = logging.getLogger("keras_vit")

AUTOTUNE = tf.data.AUTOTUNE
# Split folders recognised inside an image folder (train/ plus one of the others).
EVAL_SPLIT_FOLDERS = ("val", "validation", "test")


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
        skipped: image files left out because they are not readable images.
        undecodable: `{name: reason}` of the files that passed the start-up check but
            failed to decode while a pipeline read them (left out of the stream, see
            `keras_vit.data.pipelines`), filled as the pipelines meet them.
        strict: such a failure is an error naming the file, not skipped.
        libjpeg: a local folder's `keras_vit.data.libjpeg.BackgroundCheck` (not
            started: a training run starts it), which names the files kept that decode
            with a libjpeg warning; None for other sources.
    """

    name: str
    records: tf.data.Dataset
    size: int
    num_classes: int
    encoded: bool
    read: Callable = tf.identity
    class_names: Optional[list] = None
    skipped: list = dataclasses.field(default_factory=list)
    undecodable: dict = dataclasses.field(default_factory=dict)
    strict: bool = False
    libjpeg: Optional[BackgroundCheck] = None


def load_source(spec, split="train", *, strict=False, data_dir=None):
    """Loads a labelled image source.

    Args:
        spec: `"digits"` (scikit-learn's 8x8 digits, 1437 train / 360 test images,
            built in), `"tfds:NAME"` or `"tfds:NAME:SPLIT"` (any TensorFlow Datasets
            split, slicing included, e.g. `"tfds:imagenet2012:train[:99%]"`), or a
            folder with one sub-folder of image files per class (optionally inside
            `train/` and `val/`, `validation/` or `test/` split folders). A split
            written in `spec` wins over `split`.
        split: `"train"` or `"test"` (for TFDS any split name; `"test"` falls back to
            `"validation"` when a dataset has no test split).
        strict: raise on image files that are not readable and on class folders
            without one (see `keras_vit.data.folders`) instead of skipping them.
        data_dir: where TFDS datasets are prepared (default: `TFDS_DATA_DIR`, else
            `~/tensorflow_datasets`); datasets prepared there are found by name alone.

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
        source = _tfds(name, spec_split(spec) or split, data_dir, chosen=spec_split(spec) is None)
        return dataclasses.replace(source, strict=strict)
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
    """scikit-learn's digits (`keras_vit.digits`): uint8 0-255, one channel."""
    if split not in SPLITS:
        raise NoSplitError(f"The digits source has splits 'train' and 'test', got {split!r}.")
    images, labels = digits_arrays(split)
    records = tf.data.Dataset.from_tensor_slices((images, labels))
    return Source(
        name=f"digits:{split}",
        records=records,
        size=len(labels),
        num_classes=10,
        encoded=False,
        class_names=[str(d) for d in range(10)],
    )


def _tfds(name, split, data_dir=None, chosen=True):
    """A TFDS dataset, prepared as TFRecord or ArrayRecord files, as `(encoded image, label)`.

    `chosen`: the split is the caller's default, not the user's (then an unlabelled test
    split, such as imagenet2012's, gives way to the validation split).
    """
    import tensorflow_datasets as tfds

    # TFDS reads TFDS_DATA_DIR once, when imported; reading it here honours a later change.
    data_dir = data_dir or os.environ.get("TFDS_DATA_DIR") or None
    try:
        # A name TFDS does not know is still found when it is prepared under data_dir
        # (TFDS reads its dataset_info.json): datasets built by the user's own builders.
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise ValueError(
            f"TFDS has no dataset {name!r}, and none is prepared under "
            f"{data_dir or tfds.core.constants.DATA_DIR} (set data_dir or "
            "TFDS_DATA_DIR to the folder that holds it)."
        ) from None
    if not builder.is_prepared():
        check_manual_download(builder)
        try:
            check_downloads_reachable(builder)
            builder.download_and_prepare()
        except ImportError as err:  # TFDS and its builders import what they need only here
            module = (err.name or "").split(".")[0]
            needed = (
                f"the Python module {module!r}, which is not installed: pip install {module}"
                if module else f"a module that cannot be imported ({err})"
            )
            raise ValueError(
                f"Preparing TFDS dataset {name!r} needs {needed} (or prepare the dataset "
                "where it is installed, and set TFDS_DATA_DIR to the folder that holds it)."
            ) from None
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
    decoders = {image_key: tfds.decode.SkipDecoding()}
    if info.file_format == tfds.core.file_adapters.FileFormat.ARRAY_RECORD:
        examples = array_record_examples(builder, split, decoders)
    else:
        examples = builder.as_dataset(split=split, decoders=decoders, shuffle_files=False)
    records = examples.map(
        lambda ex: (ex[image_key], tf.cast(ex[label_key], tf.int32)),
        num_parallel_calls=AUTOTUNE,
        deterministic=True,
    )
    size = int(info.splits[split].num_examples)
    # TFDS labels the examples of unlabelled splits -1 (imagenet2012's test images).
    if size and int(next(iter(records.take(1)))[1]) < 0:
        if chosen and split == "test" and "validation" in info.splits:
            logger.warning("TFDS dataset %r: its test split has no labels; evaluating on "
                           "its validation split.", name)
            return _tfds(name, "validation", data_dir)
        raise ValueError(
            f"TFDS dataset {name!r}: split {split!r} has no labels (TFDS marks them -1); "
            f"use one of its labelled splits ({', '.join(info.splits)})."
        )
    label = info.features[label_key]
    return Source(
        name=f"tfds:{name}:{split}",
        records=records.apply(tf.data.experimental.assert_cardinality(size)),
        size=size,
        num_classes=int(label.num_classes),
        encoded=True,
        class_names=list(label.names),
    )


def check_manual_download(builder):
    """Raises `ValueError` in one line when `builder` needs files the user must download.

    Datasets such as `imagenet2012` cannot be downloaded by TFDS; the line names the
    folder TFDS reads them from (its `manual_dir`) and what they are.
    """
    instructions = builder.MANUAL_DOWNLOAD_INSTRUCTIONS
    if not instructions:
        return
    manual_dir = os.path.join(str(builder.data_dir_root), "downloads", "manual")
    if tf.io.gfile.isdir(manual_dir) and tf.io.gfile.listdir(manual_dir):
        return
    raise ValueError(
        f"TFDS dataset {builder.name!r} is not prepared and needs a manual download: put its "
        f"files in {manual_dir} ({' '.join(instructions.split())}), then run again; TFDS "
        f"prepares it once into {builder.data_dir_root}."
    )


def check_downloads_reachable(builder, timeout=10):
    """Raises `ValueError` in one line when no host `builder` downloads from answers.

    Offline (or behind a proxy that refuses), TFDS retries each download for minutes
    before its error; one request per host (the proxy settings of the environment
    honoured, as TFDS's `requests` honours them) says so in seconds. Datasets whose
    downloads TFDS does not list are left to TFDS.
    """
    urls = {}
    for url in builder.url_infos or {}:
        urls.setdefault(urllib.parse.urlsplit(url).netloc, url)
    reasons = []
    for url in urls.values():
        try:
            # An opener of its own: `urlopen`'s is built once per process, keeping the
            # proxy settings of its first call for every later download.
            opener = urllib.request.build_opener()
            opener.open(urllib.request.Request(url, method="HEAD"), timeout=timeout)
            return
        except urllib.error.HTTPError:  # the server answered
            return
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            reasons.append(f"{urllib.parse.urlsplit(url).netloc}: "
                           f"{getattr(reason, 'strerror', None) or reason}")
    if reasons:
        raise ValueError(
            f"TFDS dataset {builder.name!r} is not prepared under {builder.data_dir_root} "
            f"and cannot be downloaded: the network is unreachable ({'; '.join(reasons)}). "
            "Prepare it where there is a network and set TFDS_DATA_DIR to the folder "
            "that holds it."
        )


def array_record_examples(builder, split, decoders, chunk=256):
    """A split prepared as ArrayRecord files, as a `tf.data.Dataset` of examples in order.

    TFDS reads ArrayRecord files only through its random-access data source
    (`builder.as_data_source`); the records are read by index, `chunk` at a time, and
    parsed by the dataset's own feature specification, as `as_dataset` parses TFRecords.
    """
    reader = builder.as_data_source(split=split).data_source
    features = builder.info.features

    def read(indices):
        return tf.constant(reader.__getitems__(indices.numpy().tolist()), tf.string)

    def read_chunk(indices):
        serialized = tf.py_function(read, [indices], tf.string)
        serialized.set_shape(indices.shape)
        return serialized

    return (
        tf.data.Dataset.range(len(reader))
        .batch(chunk)
        .map(read_chunk, num_parallel_calls=AUTOTUNE, deterministic=True)
        .unbatch()
        .map(
            lambda serialized: features.deserialize_example(serialized, decoders=decoders),
            num_parallel_calls=AUTOTUNE,
            deterministic=True,
        )
    )


def _train_labels(train, folder, classes, labels):
    """`(classes, labels)` of an evaluation folder numbered as the train folder's classes.

    Each split numbers its own class folders; a class missing from the evaluation folder
    would shift the labels of every class after it.
    """
    train_classes = load_listing(train).classes
    if classes == train_classes:
        return classes, labels
    unknown = sorted(set(classes) - set(train_classes))
    if unknown:
        raise ValueError(
            f"{folder!r} has class folders that {train!r} lacks: {', '.join(unknown[:5])}"
            f"{' ...' if len(unknown) > 5 else ''}; both splits need the same classes."
        )
    logger.warning(
        "%s has %d of the %d classes of %s; its labels follow %s.",
        folder, len(classes), len(train_classes), train, train,
    )
    index = {name: i for i, name in enumerate(train_classes)}
    return train_classes, [index[classes[label]] for label in labels]


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
    listing = load_listing(folder)
    classes, paths, labels = listing.classes, listing.paths, listing.labels
    if listing.ignored:
        logger.warning(listing.ignored_line(folder))
    if listing.empty:
        if strict:
            raise ValueError(listing.empty_line(folder) + " (strict data mode; remove them)")
        logger.warning(listing.empty_line(folder))
    if folder != root and split != "train":
        classes, labels = _train_labels(os.path.join(root, "train"), folder, classes, labels)
    if len(classes) < 2 or not paths:
        raise ValueError(
            f"Image folder {folder!r} needs one sub-folder per class (at least 2) holding "
            f"{'/'.join(IMAGE_EXTENSIONS)} files; found {len(classes)} class folders and "
            f"{len(paths)} readable images."
        )
    skipped = sorted(listing.damaged)
    if skipped:
        listing_text = "\n  ".join(f"{path}: {listing.damaged[path]}" for path in skipped)
        message = (
            f"{len(skipped)} of {len(paths) + len(skipped)} files in {folder!r} are not "
            f"readable images:\n  {listing_text}"
        )
        if strict:
            raise ValueError(message + "\n(strict data mode; fix or remove these files)")
        logger.warning("Skipping %s", message)
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
        strict=strict,
        libjpeg=None if is_url(folder) else BackgroundCheck(listing),
    )
