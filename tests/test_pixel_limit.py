"""The pixel limit (as Pillow's MAX_IMAGE_PIXELS): a file whose header declares more
pixels is refused from its header, before it is decoded, in the start-up check of a
folder, in `read_images` (predict) and in the SavedModel's `serving_bytes`."""

import logging
import struct
import zlib

import numpy as np
import pytest
import tensorflow as tf

from keras_vit import data, export_saved_model
from keras_vit.data import headers
from helpers import tiny_vit

SIDE = 20_000


def chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def huge_png(side=SIDE):
    """A real PNG of side x side black pixels (1-bit grey): a few tens of KB on disk,
    side**2 bytes (400 MB at 20,000) once decoded."""
    rows = zlib.compressobj(9)
    row = b"\0" * (1 + (side + 7) // 8)  # filter byte, then the packed row
    packed = b"".join(rows.compress(row) for _ in range(side)) + rows.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    chunks = chunk(b"IHDR", header) + chunk(b"IDAT", packed) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


@pytest.fixture(scope="module")
def huge(tmp_path_factory):
    path = tmp_path_factory.mktemp("huge") / "huge.png"
    path.write_bytes(huge_png())
    return path


def small_png(side=40):
    return tf.io.encode_png(tf.fill([side, side, 3], tf.constant(200, tf.uint8))).numpy()


def test_the_huge_png_is_small_and_valid(huge):
    payload = huge.read_bytes()
    assert len(payload) < 1_000_000 and headers.image_problem(payload, max_pixels=None) is None
    # Its size, as the SavedModel's graph reads it from the header.
    assert [int(side) for side in data.decode.encoded_size(payload)] == [SIDE, SIDE]


def test_the_folder_check_skips_and_names_an_oversize_image(tmp_path, huge, caplog):
    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        for i in range(2):
            (tmp_path / label / f"{i}.png").write_bytes(small_png())
    (tmp_path / "a" / "huge.png").write_bytes(huge.read_bytes())
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        source = data.load_source(str(tmp_path))
    assert source.skipped == [str(tmp_path / "a" / "huge.png")] and source.size == 4
    assert (
        f"{tmp_path / 'a' / 'huge.png'}: 20000x20000 pixels, over the limit of 89478485 "
        "(set KERAS_VIT_MAX_IMAGE_PIXELS to raise it)" in caplog.text
    )


def test_read_images_refuses_an_oversize_image_naming_it(huge):
    message = rf"{huge}.*20000x20000 pixels, over the limit of 89478485"
    with pytest.raises(ValueError, match=message):
        data.read_images([str(huge)], 16)


def test_the_limit_is_set_by_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "small.png"
    path.write_bytes(small_png(40))
    monkeypatch.setenv("KERAS_VIT_MAX_IMAGE_PIXELS", "1599")
    with pytest.raises(ValueError, match="40x40 pixels, over the limit of 1599"):
        data.read_images([str(path)], 16)
    monkeypatch.setenv("KERAS_VIT_MAX_IMAGE_PIXELS", "1600")
    assert data.read_images([str(path)], 16).shape == (1, 16, 16, 3)
    monkeypatch.setenv("KERAS_VIT_MAX_IMAGE_PIXELS", "none")
    assert headers.max_image_pixels() is None
    monkeypatch.setenv("KERAS_VIT_MAX_IMAGE_PIXELS", "-5")
    message = "KERAS_VIT_MAX_IMAGE_PIXELS must be a positive number of pixels or 'none', got '-5'"
    with pytest.raises(ValueError, match=message):
        data.read_images([str(path)], 16)


def test_serving_bytes_refuses_an_oversize_image(tmp_path, huge, monkeypatch):
    monkeypatch.setenv("KERAS_VIT_MAX_IMAGE_PIXELS", str(40 * 40))  # baked in at export
    export_saved_model(tiny_vit(), tmp_path / "served")
    monkeypatch.delenv("KERAS_VIT_MAX_IMAGE_PIXELS")
    serve = tf.saved_model.load(str(tmp_path / "served")).signatures["serving_bytes"]
    served = serve(image_bytes=tf.constant([small_png(40)]))["probabilities"].numpy()
    assert served.shape == (1, 10) and np.isfinite(served).all()
    for payload, size in ((small_png(41), 41), (huge.read_bytes(), SIDE)):
        message = rf"Image over the pixel limit of 1600 .*\] \[{size}\] \[x\] \[{size}\]"
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            serve(image_bytes=tf.constant([payload]))
