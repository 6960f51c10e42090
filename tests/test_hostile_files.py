"""Image folders as found: damaged files inside, files changed after the listing was cached,
symbolic link loops, class folders without an image."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from keras_vit import data
from keras_vit.data import folders
from helpers import decodes


def jpeg(seed, shape=(96, 128, 3)):
    pixels = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    return tf.io.encode_jpeg(pixels, quality=90).numpy()


def write(path, payload):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return path


def garbled(payload, seed=0):
    """`payload` with its middle third overwritten by random bytes: header and end marker
    intact, as a file damaged on disk or in a copy."""
    data = bytearray(payload)
    third = len(data) // 3
    data[third:2 * third] = np.random.default_rng(seed).integers(0, 256, third, np.uint8).tobytes()
    return bytes(data)


def make_tree(root, per_class=4):
    for label in ("a", "b"):
        for i in range(per_class):
            write(root / label / f"{i}.jpg", jpeg(10 * (label == "b") + i))
    return root


def test_a_jpeg_garbled_inside_is_skipped_and_named_before_training(tmp_path, caplog):
    root = make_tree(tmp_path / "tree")
    bad = write(root / "a" / "garbled.jpg", garbled(jpeg(99)))
    payload = bad.read_bytes()
    # As found: a JPEG's start and end, which the check used to read, and a decoder error.
    assert payload[:3] == b"\xff\xd8\xff" and payload[-2:] == b"\xff\xd9"
    assert not decodes(payload)
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        source = data.load_source(str(root))
    assert source.skipped == [str(bad)] and source.size == 8
    (line,) = [r.getMessage() for r in caplog.records if "not readable" in r.getMessage()]
    assert f"{bad}: corrupt JPEG" in line and "1 of 9 files" in line
    # A whole pass of training batches decodes: the garbled file is not in the stream.
    stream = data.train_dataset(source, image_size=16, batch_size=8)
    images, _ = next(iter(stream))
    assert np.isfinite(images.numpy()).all()


def test_a_file_truncated_after_the_listing_was_cached_is_checked_again(tmp_path):
    root = make_tree(tmp_path / "tree")
    cache = str(tmp_path / "cache")
    assert not folders.load_listing(str(root), cache).damaged
    victim = root / "b" / "2.jpg"
    stamp = os.stat(root / "b").st_mtime_ns
    with open(victim, "r+b") as f:  # truncated in place: the class folder's mtime stays
        f.truncate(os.path.getsize(victim) // 2)
    os.utime(root / "b", ns=(stamp, stamp))
    assert not decodes(victim.read_bytes())
    listing = folders.load_listing(str(root), cache)
    assert listing.cached
    assert listing.damaged == {str(victim): "truncated JPEG (no end marker)"}
    assert str(victim) not in listing.paths and len(listing.paths) == 7
    # The re-checked listing is what the cache holds now.
    assert folders.load_listing(str(root), cache).damaged == listing.damaged


def test_symbolic_link_loops_are_skipped_as_dangling_links_are(tmp_path, caplog):
    root = make_tree(tmp_path / "tree")
    os.symlink("loop", root / "loop")  # beside the class folders
    os.symlink("self.jpg", root / "a" / "self.jpg")  # among the images
    os.symlink("nothing.jpg", root / "b" / "dangling.jpg")
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        source = data.load_source(str(root))
    assert source.class_names == ["a", "b"] and source.size == 8
    assert source.skipped == [str(root / "a" / "self.jpg"), str(root / "b" / "dangling.jpg")]
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert f"{root / 'a' / 'self.jpg'}: unreadable (Too many levels of symbolic links)" in text
    assert "1 loose files beside the class folders" in text


def test_class_folders_without_an_image_are_not_classes(tmp_path, caplog):
    root = make_tree(tmp_path / "tree")
    (root / "empty").mkdir()
    write(root / "nested" / "inner" / "0.jpg", jpeg(5))  # images only in a sub-folder
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        source = data.load_source(str(root))
    # Three or four classes would have been a 4-way head with classes never seen.
    assert source.class_names == ["a", "b"] and source.num_classes == 2
    labels = sorted(int(label) for _, label in source.records.as_numpy_iterator())
    assert labels == [0] * 4 + [1] * 4
    (line,) = [r.getMessage() for r in caplog.records if "hold no readable image" in r.getMessage()]
    assert line == (
        f"2 class folders in {root} hold no readable image and are not classes: "
        "empty (no image files); nested (no image files directly inside, 1 sub-folders "
        "(not read))."
    )
    with pytest.raises(ValueError, match="empty .no image files.*strict data mode"):
        data.load_source(str(root), strict=True)


def test_the_check_agrees_with_the_decoder_on_randomly_garbled_jpegs():
    """Random bytes over a random stretch of baseline and progressive JPEGs: the check
    flags none that TensorFlow decodes and nearly all that it refuses (what it misses
    are tables garbled in ways only decoding shows)."""
    rng = np.random.default_rng(0)
    flagged = {True: 0, False: 0}
    refused = 0
    for shape, progressive in [((64, 48, 3), False), ((200, 300, 3), True), ((50, 50, 1), False)]:
        pixels = rng.integers(0, 256, shape, dtype=np.uint8)
        payload = tf.io.encode_jpeg(pixels, quality=90, progressive=progressive).numpy()
        for _ in range(40):
            start = int(rng.integers(20, len(payload) - 20))
            length = int(rng.integers(1, min(400, len(payload) - start - 4)))
            damaged = bytearray(payload)
            damaged[start:start + length] = rng.integers(0, 256, length, np.uint8).tobytes()
            ok = decodes(bytes(damaged))
            refused += not ok
            flagged[ok] += data.headers.image_problem(bytes(damaged)) is not None
    assert flagged[True] == 0
    assert refused >= 40 and flagged[False] >= 0.95 * refused, (flagged, refused)


def test_a_remote_folder_is_checked_from_its_first_and_last_bytes():
    # TensorFlow's in-memory file system stands for gs://: the same tf.io.gfile calls.
    root = "ram://hostile_remote"
    big = jpeg(0, shape=(400, 400, 3))  # longer than the first bytes read
    for label in ("a", "b"):
        tf.io.gfile.makedirs(f"{root}/{label}")
        for i in range(2):
            tf.io.write_file(f"{root}/{label}/{i}.jpg", big)
    tf.io.write_file(f"{root}/a/half.jpg", big[:len(big) // 2])
    tf.io.write_file(f"{root}/b/garbled.jpg", garbled(jpeg(1)))  # short: read whole
    source = data.load_source(root)
    assert source.size == 4 and source.skipped == [f"{root}/a/half.jpg", f"{root}/b/garbled.jpg"]
