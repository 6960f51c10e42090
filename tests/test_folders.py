"""Image folders: what is a class and an image, the start-up check, the listing cache."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from keras_vit import data
from keras_vit.data import folders
from helpers import decodes


def pixels(seed, shape=(24, 32, 3)):
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def jpeg(seed):
    return tf.io.encode_jpeg(pixels(seed)).numpy()


def png(seed):
    return tf.io.encode_png(pixels(seed)).numpy()


def write(path, payload):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return path


def test_hidden_entries_are_neither_classes_nor_images_and_ignored_ones_are_summed_up(
    tmp_path, caplog
):
    root = tmp_path / "images"
    for i, name in enumerate(["cat", "dog"]):
        write(root / name / "a.jpg", jpeg(i))
        write(root / name / "b.png", png(i))
        write(root / name / ".c.jpg", jpeg(i))  # hidden (e.g. macOS' ._ files)
    # A notebook's checkpoint folder would have become class 0 and moved every label.
    write(root / ".ipynb_checkpoints" / "a.jpg", jpeg(5))
    write(root / "cat" / "more" / "d.jpg", jpeg(6))
    write(root / "cat" / "e.tif", b"II*\0")
    write(root / "dog" / "notes.txt", b"dogs")
    write(root / "README", b"a loose file")
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        source = data.load_source(str(root))
    assert source.class_names == ["cat", "dog"] and source.size == 4
    assert sorted(
        (os.path.relpath(path.decode(), root), int(label))
        for path, label in source.records.as_numpy_iterator()
    ) == [("cat/a.jpg", 0), ("cat/b.png", 0), ("dog/a.jpg", 1), ("dog/b.png", 1)]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Ignored")]
    assert lines == [
        f"Ignored in {root}: 1 .tif files, 1 .txt files, 3 hidden entries, 1 loose files "
        "beside the class folders, 1 nested folders (classes are the sub-folders; images "
        "are .jpg/.jpeg/.png/.gif/.bmp/.webp files directly inside them)."
    ]


def test_the_start_up_check_leaves_out_what_the_decoder_fails_on(tmp_path):
    """Without decoding: each file's bytes, against TensorFlow's decoder."""
    good, bad = jpeg(0), png(1)
    cases = {
        "jpeg.jpg": good,
        "png_named.jpg": bad,
        "padded.jpg": good + b"\0" * 64,  # written with padding after the end marker
        "empty.jpg": b"",
        "text.png": b"<html>404</html>",
        "half.jpg": good[: len(good) // 2],  # an interrupted download
        "half.png": bad[: len(bad) // 2],
    }
    paths = {name: str(write(tmp_path / name, payload)) for name, payload in cases.items()}
    damaged = data.find_damaged(sorted(paths.values()))
    assert {os.path.basename(p) for p in damaged} == {
        name for name, payload in cases.items() if not decodes(payload)
    } == {"empty.jpg", "text.png", "half.jpg", "half.png"}
    assert damaged[paths["half.jpg"]] == "truncated JPEG (no end marker)"
    assert damaged[paths["text.png"]] == "not a JPEG, PNG, GIF, BMP or WebP file"


@pytest.fixture()
def tree(tmp_path):
    root = tmp_path / "tree"
    for label in ("a", "b"):
        for i in range(3):
            write(root / label / f"{i}.jpg", jpeg(i))
    write(root / "b" / "broken.jpg", jpeg(9)[:100])
    return root


def test_the_listing_is_cached_until_a_class_folder_changes(tree, tmp_path):
    cache = str(tmp_path / "cache")
    first = folders.load_listing(str(tree), cache)
    assert not first.cached and len(first.paths) == 6
    assert list(first.damaged) == [str(tree / "b" / "broken.jpg")]
    again = folders.load_listing(str(tree), cache)
    assert again.cached
    assert (again.classes, again.paths, again.labels, again.damaged) == (
        first.classes, first.paths, first.labels, first.damaged,
    )
    # A file added to a class folder changes its modification time: listed anew.
    write(tree / "a" / "3.jpg", jpeg(3))
    added = folders.load_listing(str(tree), cache)
    assert not added.cached and str(tree / "a" / "3.jpg") in added.paths
    assert folders.load_listing(str(tree), cache).cached


def test_a_damaged_file_fixed_in_place_is_taken_back(tree, tmp_path):
    cache = str(tmp_path / "cache")
    folders.load_listing(str(tree), cache)
    broken = tree / "b" / "broken.jpg"
    stamp = os.stat(tree / "b").st_mtime_ns
    broken.write_bytes(jpeg(9))  # rewritten in place: the folder's mtime may not move
    os.utime(tree / "b", ns=(stamp, stamp))
    fixed = folders.load_listing(str(tree), cache)
    assert str(broken) in fixed.paths and not fixed.damaged


def test_an_unwritable_cache_only_costs_the_cache(tree, tmp_path):
    blocker = write(tmp_path / "file", b"")  # a file where the cache folder would be
    listing = folders.load_listing(str(tree), str(blocker))
    assert len(listing.paths) == 6 and not listing.cached


def test_an_eval_folder_missing_a_class_keeps_the_train_folders_labels(tmp_path, caplog):
    root = tmp_path / "split"
    for name in ("ant", "bee", "cow"):
        write(root / "train" / name / "0.jpg", jpeg(0))
    for name in ("ant", "cow"):  # no bee in val/: cow must stay label 2, not become 1
        write(root / "val" / name / "0.jpg", jpeg(1))
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        test = data.load_source(str(root), "test")
    assert test.class_names == ["ant", "bee", "cow"] and test.num_classes == 3
    assert sorted(
        (os.path.basename(os.path.dirname(path.decode())), int(label))
        for path, label in test.records.as_numpy_iterator()
    ) == [("ant", 0), ("cow", 2)]
    assert "has 2 of the 3 classes" in caplog.text
    write(root / "val" / "dog" / "0.jpg", jpeg(2))
    with pytest.raises(ValueError, match="class folders that .*train' lacks: dog"):
        data.load_source(str(root), "test")
