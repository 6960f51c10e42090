"""Every image format the README lists (JPEG, PNG, GIF, BMP, WebP), decoded the same in
every path: the training and evaluation pipelines, `read_images` (predict) and the
SavedModel's `serving_bytes`, for 1- and 3-channel models."""

import io

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_vit import data
from keras_vit import export_saved_model
from keras_vit.models.vit import preprocess
from helpers import tiny_vit

# Lossless in every format: grey levels (R = G = B, so every grey conversion agrees)
# from a palette of four, which GIF keeps exactly.
LEVELS = np.array([0, 85, 170, 255], np.uint8)


def picture(seed, shape=(24, 40)):
    grey = LEVELS[np.random.default_rng(seed).integers(0, 4, shape)]
    return np.repeat(grey[..., None], 3, axis=-1)


def encoded(pixels, fmt):
    image = Image.fromarray(pixels)
    if fmt == "GIF":
        image = image.convert("P", palette=Image.Palette.ADAPTIVE, colors=len(LEVELS))
    buffer = io.BytesIO()
    image.save(buffer, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    return buffer.getvalue()


FILES = {"png": "PNG", "gif": "GIF", "bmp": "BMP", "webp": "WEBP", "gif_named.png": "GIF"}


def write_files(folder, pixels):
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, fmt in FILES.items():
        path = folder / (name if "." in name else f"image.{name}")
        path.write_bytes(encoded(pixels, fmt))
        paths[name] = str(path)
    return paths


@pytest.mark.parametrize("channels", [1, 3])
def test_read_images_decodes_every_format_as_the_png(tmp_path, channels):
    paths = write_files(tmp_path, picture(0))
    batch = data.read_images(list(paths.values()), 16, channels=channels)
    assert batch.shape == (len(paths), 16, 16, channels)
    for row in batch[1:]:
        np.testing.assert_array_equal(row, batch[0])


@pytest.mark.parametrize("channels", [1, 3])
def test_the_pipelines_decode_every_format_from_a_folder(tmp_path, channels):
    for label, seed in (("a", 1), ("b", 2)):
        write_files(tmp_path / "tree" / label, picture(seed))
    source = data.load_source(str(tmp_path / "tree"))
    assert source.size == 2 * len(FILES) and not source.skipped
    images, labels = next(iter(
        data.eval_dataset(source, 16, 2 * len(FILES), channels=channels, crop_fraction=1.0)
    ))
    for label in range(2):
        rows = images.numpy()[labels.numpy()[:, label] == 1]
        assert len(rows) == len(FILES)
        for row in rows[1:]:
            np.testing.assert_array_equal(row, rows[0])
    stream = data.train_dataset(source, 16, 2 * len(FILES), channels=channels)
    images, _ = next(iter(stream))
    assert images.shape == (2 * len(FILES), 16, 16, channels)


@pytest.mark.parametrize("channels", [1, 3])
def test_serving_bytes_takes_every_format(tmp_path, channels):
    model = tiny_vit(channels=channels)
    export_saved_model(model, tmp_path / "served")
    serve = tf.saved_model.load(str(tmp_path / "served")).signatures["serving_bytes"]
    pixels = picture(3, (32, 32))
    payloads = [encoded(pixels, fmt) for fmt in FILES.values()]
    probabilities = serve(image_bytes=tf.constant(payloads))["probabilities"].numpy()
    for row in probabilities[1:]:
        np.testing.assert_array_equal(row, probabilities[0])
    # At the model's size nothing is resized: the PNG's pixels, as the model sees them.
    images = preprocess(pixels[None, ..., :channels].astype("float32"))
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(model(images)))[0]
    np.testing.assert_allclose(probabilities[0], expected, atol=1e-6)
