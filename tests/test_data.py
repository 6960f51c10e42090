"""Input pipelines: sources, inception crop, eval crop, resumable and shardable streams."""

import logging
import os
import random

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_vit import data


def _write_images(root, sizes_by_class, corrupt=()):
    """A class folder tree of JPEGs and PNGs made here; `corrupt` names bad files."""
    rng = np.random.default_rng(0)
    for label, sizes in sizes_by_class.items():
        folder = root / label
        folder.mkdir(parents=True)
        for i, (height, width) in enumerate(sizes):
            pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            encode = tf.io.encode_jpeg if i % 2 else tf.io.encode_png
            (folder / f"{i}.{'jpg' if i % 2 else 'png'}").write_bytes(encode(pixels).numpy())
    for name in corrupt:
        (root / name).write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG")
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    sizes = [(40, 60), (64, 48), (33, 33)]
    return _write_images(root, {"cat": sizes, "dog": sizes}, corrupt=["dog/broken.jpg"])


def test_folder_skips_a_corrupt_file_and_names_it(folder, caplog):
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        source = data.load_source(str(folder))
    assert source.size == 6 and source.num_classes == 2
    assert source.class_names == ["cat", "dog"]
    assert source.skipped == [str(folder / "dog" / "broken.jpg")]
    assert "1 of 7 files" in caplog.text and "broken.jpg" in caplog.text
    # Two passes over the data run without an error.
    stream = data.train_dataset(source, 16, 4, seed=1)
    labels = np.concatenate([y for _, y in stream.take(3)])
    assert labels.shape == (12, 2)
    with pytest.raises(ValueError, match="broken.jpg"):
        data.load_source(str(folder), strict=True)


def test_augmented_stream_is_static_in_range_and_restartable(folder):
    source = data.load_source(str(folder))

    def stream(start):
        # 6 images, batch 4: the shuffled epochs' boundaries fall inside batches.
        return data.train_dataset(
            source, 24, 4, seed=3, augment="medium2", cutmix=1.0, start_batch=start
        )

    full = list(stream(0).take(6))
    images_spec, labels_spec = stream(0).element_spec
    assert images_spec.shape.as_list() == [4, 24, 24, 3]
    assert labels_spec.shape.as_list() == [4, 2]
    for images, labels in full:
        images = images.numpy()
        assert images.min() >= -1.0 and images.max() <= 1.0
        np.testing.assert_allclose(labels.numpy().sum(axis=1), 1.0, atol=1e-5)
    assert len({images.numpy().tobytes() for images, _ in full}) == 6  # all differ
    pixels = np.stack([images for images, _ in full])
    assert pixels.min() < -0.5 and pixels.max() > 0.5  # the range is used, not squashed
    # Restarted at batch 3, the stream goes on exactly as the uninterrupted one.
    for (a, b), (c, d) in zip(full[3:], stream(3).take(3)):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)


def test_stream_order_is_a_function_of_seed_and_position():
    # Ten records, passes of ten: positions 0-9 are pass 0, 10-19 pass 1, ...
    from keras_vit.data.pipelines import ordered_stream

    records = tf.data.Dataset.range(10)
    stream = ordered_stream(records, 10, shuffle_buffer=10, seed=7)
    first = [(int(p), int(r)) for p, r in stream.take(40)]
    assert [p for p, _ in first] == list(range(40))
    passes = [[r for _, r in first[i:i + 10]] for i in range(0, 40, 10)]
    assert all(sorted(p) == list(range(10)) for p in passes)  # each pass is a permutation
    assert len({tuple(p) for p in passes}) == 4  # reshuffled every pass
    # A second iterator over the same dataset (Keras opens more than one) and a stream
    # started at any position, in the first pass or after it, give the same records.
    assert [(int(p), int(r)) for p, r in stream.take(40)] == first
    for start in (3, 10, 17, 31):
        restarted = ordered_stream(records, 10, shuffle_buffer=10, seed=7, start=start)
        assert [(int(p), int(r)) for p, r in restarted.take(40 - start)] == first[start:]
    other = ordered_stream(records, 10, shuffle_buffer=10, seed=8)
    assert [int(r) for _, r in other.take(10)] != passes[0]


def test_training_batches_restart_exactly_across_passes(folder):
    source = data.load_source(str(folder))  # 6 images: a pass ends every 1.5 batches

    def stream(start):
        return data.train_dataset(source, 16, 4, seed=1, start_batch=start)

    uninterrupted = stream(0)
    list(uninterrupted.take(2))  # an iterator opened before, as Keras does
    full = list(uninterrupted.take(8))
    for start in (1, 3, 6):
        for (a, b), (c, d) in zip(full[start:], stream(start).take(8 - start)):
            np.testing.assert_array_equal(a, c)
            np.testing.assert_array_equal(b, d)


def test_pipelines_run_without_autotuning_and_yield_the_autotuned_batches():
    """Both pipelines switch tf.data's autotuning off, with one map call per core: its
    optimisation thread could make a call over them wait at its end for the thread's next
    wake-up, up to a minute (1.5 to 6 s after a `predict`, `evaluate` or `fit` on 2 CPU cores). The batches are those the autotuned
    pipeline yields, exactly."""
    digits = data.load_source("digits", "test")
    autotuned = tf.data.Options()
    autotuned.autotune.enabled = True
    for dataset in (
        data.train_dataset(digits, 16, 8, channels=1, seed=3, randaugment=(2, 10)),
        data.eval_dataset(digits, 16, 8, channels=1, crop_fraction=0.875),
    ):
        assert dataset.options().autotune.enabled is False
        assert dataset.options().autotune.initial_parallelism == os.cpu_count()
        tuned = dataset.with_options(autotuned)
        assert tuned.options().autotune.enabled is True
        for (images, labels), (tuned_images, tuned_labels) in zip(dataset.take(3), tuned.take(3)):
            np.testing.assert_array_equal(images, tuned_images)
            np.testing.assert_array_equal(labels, tuned_labels)


@pytest.mark.parametrize(
    "make", [np.asarray, lambda a: a[:, ::-1], lambda a: a.tolist(), tf.constant],
    ids=["contiguous", "strided", "nested-list", "tensor"],
)
def test_array_batches_sliced_a_batch_at_a_time_equal_the_shardable_batches(make):
    """`array_batches(..., shardable=False)` (a model without a strategy: NumPy arrays
    sliced as each batch is read) yields exactly the batches, shapes and dtypes of the
    shardable pipeline made from one tensor of the whole arrays: a partial last batch,
    a strided view, an array given as nested lists, a tensor beside an array (read as one
    tensor), image and label arrays together."""
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (11, 4, 4, 3)).astype("float32")
    labels = rng.integers(0, 10, 11)
    images = make(images)
    sliced = data.array_batches((images, labels), 4, shardable=False)
    whole = data.array_batches((np.asarray(images), labels), 4)
    assert sliced.element_spec == whole.element_spec
    assert int(sliced.cardinality()) == int(whole.cardinality()) == 3
    assert sliced.options().autotune.enabled is False
    pairs = list(zip(sliced.as_numpy_iterator(), whole.as_numpy_iterator()))
    assert [len(a) for (a, _), _ in pairs] == [4, 4, 3]
    for (a, b), (c, d) in pairs:
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)
        assert a.dtype == c.dtype and b.dtype == d.dtype


def test_array_batches_shuffle_as_keras_fit_does():
    """`array_batches(..., shuffle=True)` gives each pass a new permutation of all the
    examples (images and labels kept together), the same ones after the same
    `keras.utils.set_random_seed`; `"batch"` keeps the in-order batches and shuffles
    within each (Keras' `fit(shuffle="batch")`)."""
    images = np.arange(11, dtype="float32")[:, None] * np.ones((1, 3), "float32")
    labels = np.arange(11) + 100

    def passes(shuffle, count=3):
        keras.utils.set_random_seed(7)
        dataset = data.array_batches((images, labels), 4, shardable=False, shuffle=shuffle)
        assert int(dataset.cardinality()) == 3
        assert dataset.options().autotune.enabled is False
        result = []
        for _ in range(count):
            batches = list(dataset.as_numpy_iterator())
            assert [len(y) for _, y in batches] == [4, 4, 3]
            for x, y in batches:
                np.testing.assert_array_equal(x[:, 0] + 100, y)
            result.append([y.tolist() for _, y in batches])
        return result

    shuffled = passes(True)
    for order in shuffled:
        assert sorted(sum(order, [])) == labels.tolist()
    assert len({str(order) for order in shuffled}) == 3  # a new order each pass
    assert passes(True) == shuffled  # the same seed, the same orders
    in_order = [[100, 101, 102, 103], [104, 105, 106, 107], [108, 109, 110]]
    assert passes(False) == [in_order] * 3
    within = passes("batch")
    assert all([sorted(b) for b in order] == in_order for order in within)
    assert any(order != in_order for order in within)


def test_array_fit_arguments_read_arrays_and_leave_the_rest_to_keras():
    """`fit` reads NumPy arrays as batches of `array_batches`, the validation arrays too;
    weights, a step count, tensors or an unknown `shuffle` go to Keras as given."""
    from keras_vit.utils.tf_data import array_fit_arguments

    images, labels = np.zeros((10, 2), "float32"), np.arange(10)
    arguments = dict(x=images, y=labels, batch_size=None, shuffle=True, validation_split=0.0,
                     validation_data=(images[:3], labels[:3]), validation_batch_size=2,
                     sample_weight=None, class_weight=None, steps_per_epoch=None)
    read = array_fit_arguments(arguments)
    assert isinstance(read["x"], tf.data.Dataset) and read["y"] is None
    assert read["batch_size"] is None and read["shuffle"] is False  # shuffled by the dataset
    assert [len(y) for _, y in read["x"]] == [10]  # Keras' default batch of 32
    assert [y.numpy().tolist() for _, y in read["validation_data"]] == [[0, 1], [2]]
    assert read["validation_batch_size"] is None
    for change in (dict(sample_weight=np.ones(10)), dict(class_weight={0: 2.0}),
                   dict(steps_per_epoch=2), dict(x=tf.constant(images)), dict(shuffle="all"),
                   dict(validation_split=0.95, validation_data=None)):
        given = dict(arguments, **change)
        assert array_fit_arguments(given) is given, change


def test_array_batches_shuffle_only_sliced_arrays():
    with pytest.raises(ValueError, match="shardable=False"):
        data.array_batches(np.arange(4), 2, shuffle=True)
    with pytest.raises(ValueError, match="shuffle='all'"):
        data.array_batches(np.arange(4), 2, shardable=False, shuffle="all")


def test_inception_crop_windows_follow_the_paper():
    # Area 5%-100% of the image, aspect ratio 3/4-4/3 (up to pixel rounding).
    shape = tf.constant([300, 400, 3])
    areas, aspects = [], []
    for seed in range(200):
        _, size = data.inception_crop_window(tf.constant([seed, 7]))(shape)
        height, width = int(size[0]), int(size[1])
        areas.append(height * width / (300 * 400))
        aspects.append(width / height)
    assert 0.05 - 0.01 <= min(areas) and max(areas) <= 1.0
    assert 3 / 4 - 0.02 <= min(aspects) and max(aspects) <= 4 / 3 + 0.02
    assert max(areas) - min(areas) > 0.5  # windows vary over the range


def test_central_crop_cuts_the_centre():
    image = tf.random.uniform((40, 50, 3))
    # Short side 40 = 32 / 0.8: no resampling, just the central 32x32 window.
    np.testing.assert_allclose(
        data.central_crop(image, 32, 0.8).numpy(), image.numpy()[4:36, 9:41], atol=1e-6
    )


def test_digits_splits_partition_the_digits():
    from sklearn.datasets import load_digits

    train, test = data.load_source("digits"), data.load_source("digits", "test")
    assert (train.size, test.size, train.num_classes) == (1437, 360, 10)
    rows = [
        np.concatenate([image.reshape(-1), [label]])
        for source in (train, test)
        for image, label in source.records.as_numpy_iterator()
    ]
    digits = load_digits()
    expected = np.concatenate(
        [np.round(digits.images.reshape(-1, 64) * 255 / 16), digits.target[:, None]], axis=1
    )
    ours = np.array(rows, dtype=float)
    np.testing.assert_array_equal(ours[np.lexsort(ours.T)], expected[np.lexsort(expected.T)])


def test_input_pipelines_share_the_global_batch():
    source = data.load_source("digits")
    single = next(iter(data.train_dataset(source, 8, 16, channels=1, seed=2)))
    parts = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2
        )
        stream = data.train_dataset(source, 8, 16, channels=1, seed=2, input_context=context)
        parts.append(next(iter(stream)))
    assert parts[0][0].shape == (8, 8, 8, 1)
    together = np.concatenate([p[0].numpy().reshape(8, -1) for p in parts])
    expected = single[0].numpy().reshape(16, -1)
    # Same examples, same augmentation, split between the pipelines.
    np.testing.assert_array_equal(together[np.lexsort(together.T)], expected[np.lexsort(expected.T)])


def test_bad_sources_and_levels_are_named(tmp_path):
    with pytest.raises(ValueError, match="'nowhere/'"):
        data.load_source("nowhere/")
    with pytest.raises(data.NoSplitError, match="no 'test' split"):
        data.load_source(str(_write_images(tmp_path, {"a": [(8, 8)], "b": [(8, 8)]})), "test")
    with pytest.raises(ValueError, match="'strong3'"):
        data.augmentation_layers("strong3")


def test_select_classes_keeps_and_relabels_only_those_classes():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype("uint8")[..., None]
    _, x_test, _, y_test = train_test_split(
        images, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    source = data.select_classes(data.load_source("digits", "test"), "2,7-9")
    keep = np.isin(y_test, [2, 7, 8, 9])
    assert (source.size, source.num_classes, source.class_names) == (keep.sum(), 4, ["2", "7", "8", "9"])
    pairs = list(source.records.as_numpy_iterator())
    assert len(pairs) == source.size == int(source.records.cardinality())
    np.testing.assert_array_equal(np.stack([image for image, _ in pairs]), x_test[keep])
    np.testing.assert_array_equal([label for _, label in pairs], np.searchsorted([2, 7, 8, 9], y_test[keep]))


@pytest.mark.parametrize(
    "classes, message",
    [
        ("5-", r"got '5-' \(bad part '5-'\)"),
        ("9-5", r"got '9-5' \(bad part '9-5'\)"),
        ("3", r"classes='3' selects 1 class\(es\): expected at least 2"),
        ([1.5, 2], r"got \[1.5, 2\]"),
        ("8-11", r"classes='8-11' names class\(es\) \[10, 11\] that digits:test does not have"),
    ],
)
def test_select_classes_names_a_bad_selection(classes, message):
    with pytest.raises(ValueError, match=message):
        data.select_classes(data.load_source("digits", "test"), classes)


def test_augmentation_layers_come_from_layers_or_their_configs():
    """Recipes give augmentations as configs (making a layer starts TensorFlow); a
    hand-written config, a serialized layer and a layer all give the same layer."""
    layer = keras.layers.RandomTranslation(0.15, 0.2, fill_mode="constant")
    written = dict(
        class_name="RandomTranslation",
        config=dict(height_factor=0.15, width_factor=0.2, fill_mode="constant"),
    )
    for given in (written, keras.layers.serialize(layer)):
        built = data.as_layer(given)
        assert type(built) is keras.layers.RandomTranslation
        assert {k: v for k, v in built.get_config().items() if k != "name"} == {
            k: v for k, v in layer.get_config().items() if k != "name"
        }
    assert data.as_layer(layer) is layer
    # Building one leaves Python's seeded stream, which the model's initialisation
    # draws from next, where it was.
    random.seed(0)
    expected = random.random()
    random.seed(0)
    data.as_layer(written)
    assert random.random() == expected
    with pytest.raises(ValueError, match="'RandomShift'.* is not a Keras layer"):
        data.as_layer(dict(class_name="RandomShift", config={}))
