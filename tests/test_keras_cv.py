"""keras-cv augmentation layers in the training stream (the `keras-cv` extra).

keras-cv's layers draw from stateful TensorFlow generators; in the stream they draw from
the stream position like Keras' own, so a restarted stream repeats the uninterrupted one.
"""

import json

import keras
import numpy as np
import pytest

from keras_vit import data
from keras_vit.training.engine import TrainConfig

keras_cv = pytest.importorskip("keras_cv")


@pytest.fixture(scope="module")
def source():
    return data.load_source("digits")


def stream(source, layers, start=0, batches=4):
    batches = data.train_dataset(
        source, 16, 8, seed=1, layers=layers, start_batch=start,
        inception_crop=False, random_flip=False,
    ).take(batches)
    return np.stack([images.numpy() for images, _ in batches])


def layers():
    return [
        keras_cv.layers.RandomCropAndResize(
            target_size=(16, 16), crop_area_factor=(0.5, 1.0), aspect_ratio_factor=(0.75, 4 / 3)
        ),
        keras_cv.layers.GridMask(ratio_factor=(0.3, 0.6), rotation_factor=0.1),
    ]


def test_keras_cv_layers_draw_per_image_from_the_stream_position(source):
    plain = stream(source, [])
    augmented = stream(source, layers())
    # Each image of a batch gets its own crop and mask.
    changed = (augmented[0] != plain[0]).reshape(8, -1)
    assert len({row.tobytes() for row in changed}) == 8
    # A stream started over, or restarted at batch 2, repeats the same batches.
    np.testing.assert_array_equal(augmented, stream(source, layers()))
    np.testing.assert_array_equal(augmented[2:], stream(source, layers(), start=2, batches=2))


def test_keras_cv_layers_round_trip_through_the_run_config(source):
    """A run's config.json holds them serialized; a resumed run rebuilds the same stream."""
    given = layers()
    config = TrainConfig(augmentations=given)
    saved = json.loads(json.dumps(config.to_dict()))
    assert [a["registered_name"] for a in saved["augmentations"]] == [
        "keras_cv>RandomCropAndResize", "keras_cv>GridMask",
    ]
    restored = TrainConfig.from_dict(saved)
    np.testing.assert_array_equal(
        stream(source, restored.augmentations), stream(source, config.augmentations)
    )
    # The caller's layers are left as they were (the stream rewires copies).
    assert keras.layers.serialize(given[1]) == saved["augmentations"][1]
    # A hand-written config names keras-cv's module.
    written = dict(module="keras_cv.layers", class_name="GridMask", config=dict(ratio_factor=(0.3, 0.6)))
    assert type(data.as_layer(written)) is keras_cv.layers.GridMask


def test_keras_cv_rand_augment_runs_on_each_image(source):
    layer = keras_cv.layers.RandAugment(value_range=(0, 255), augmentations_per_image=2, magnitude=0.5)
    plain, augmented = stream(source, [], batches=1), stream(source, [layer], batches=1)
    assert augmented.min() >= -1 and augmented.max() <= 1
    changed = np.abs(augmented[0] - plain[0]).reshape(8, -1).mean(axis=1)
    assert len(set(np.round(changed, 6))) == 8
