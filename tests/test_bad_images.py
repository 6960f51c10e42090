"""Image files and datasets that go wrong only once they are read, as users meet them
(issue 48, round 3): a JPEG that passes the start-up check but fails to decode while
training, one that decodes with libjpeg's warning (kept, named), a CMYK JPEG for a 1-channel model, a file `predict` may not read, a folder
named as an image file, and a TFDS dataset to prepare on a fresh install offline."""

import contextlib
import io
import json
import os
import pwd
import re
import shutil
import socket
import tempfile
import threading
import tomllib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from helpers import bad_sos, decodes, jpeg, tiny_vit
from PIL import Image

from keras_vit import cli, data
from keras_vit.data import decode_pixels, headers
from keras_vit.training import runs

ROOT = Path(__file__).resolve().parents[1]
# The demo recipe (a 1-channel model) at its smallest: 2 epochs of 2 batches of 4.
TINY = [
    "--set", "schedule.epochs=2", "--set", "schedule.micro_batches_per_epoch=2",
    "--set", "schedule.warmup_updates=0", "--set", "data.batch_size=4",
    "--set", "distribution.jit_compile=off",
    "--set", "model.kwargs.hidden_dim=16", "--set", "model.kwargs.num_layers=1",
    "--set", "model.kwargs.num_heads=2", "--set", "model.kwargs.mlp_dim=32",
]


def garbled_without_ff(payload, seed=0):
    """`payload` with the middle of its entropy-coded data replaced by random bytes
    without 0xFF (no marker in them): libjpeg decodes noise there, with a warning."""
    damaged = bytearray(payload)
    sos = damaged.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(damaged[sos + 2:sos + 4], "big")
    end = len(damaged) - 2
    quarter = (end - start) // 4
    noise = np.random.default_rng(seed).integers(0, 255, 2 * quarter, np.uint8).tobytes()
    damaged[start + quarter:start + 3 * quarter] = noise
    return bytes(damaged)


# The line naming a file kept that decodes with libjpeg's warning, for `path`.
def kept_pattern(path):
    return (re.escape(f"Kept {path}: libjpeg warns \"") + r"(Corrupt JPEG data: [^\"]+)\""
            + re.escape(" on decoding it (the file is used; TensorFlow prints that warning "
                        "without the file name)."))


def image_folder(root, extra=None):
    """Two classes of four JPEGs, plus `extra` `{relative path: bytes}`."""
    files = {f"{label}/{i}.jpg": jpeg(10 * (label == "b") + i) for label in "ab" for i in range(4)}
    for name, payload in {**files, **(extra or {})}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(payload)
    return root


def predict_folder(root, monkeypatch, files):
    """`(model, images)`: a tiny model saved in `root` and `root/images` holding `files`
    (`{name: bytes}`), with an empty HOME."""
    monkeypatch.setenv("HOME", str(root / "home"))
    model = root / "model.keras"
    tiny_vit(image_size=16, patch_size=8).save(model)
    images = root / "images"
    images.mkdir()
    for name, payload in files.items():
        (images / name).write_bytes(payload)
    return model, images


def pretrain(tmp_path, monkeypatch, data_spec, out):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # an empty HOME: no listing cache
    return cli.main(["pretrain", "--recipe", "demo", "--data", str(data_spec), "--out",
                     str(out), *TINY])


def test_a_jpeg_failing_to_decode_while_training_is_skipped_named_and_listed(
        tmp_path, monkeypatch, capsys):
    bad_bytes = bad_sos(jpeg(99))
    root = image_folder(tmp_path / "photos", {"a/bad.jpg": bad_bytes})
    bad = root / "a" / "bad.jpg"
    # As found: the start-up check passes it, the decoder refuses it.
    assert headers.image_problem(bad_bytes) is None and not decodes(bad_bytes)
    out = tmp_path / "run"
    assert pretrain(tmp_path, monkeypatch, root, out) == 0, capsys.readouterr().err
    log = capsys.readouterr().err
    assert f"Skipping {bad}: it failed to decode (jpeg::Uncompress failed" in log
    assert log.count(f"Skipping {bad}") == 1  # named once, though met in each pass
    # The run's summary counts it.
    assert json.loads((out / runs.METRICS_JSON).read_text())["skipped_files"] == [str(bad)]
    assert (out / runs.SKIPPED_FILES).read_text() == f"{bad}\n"


def test_a_jpeg_decoding_with_a_libjpeg_warning_is_kept_named_and_listed(
        tmp_path, monkeypatch, capsys):
    noisy_bytes = garbled_without_ff(jpeg(98))
    entropy = noisy_bytes[noisy_bytes.index(b"\xff\xda") + 14:-2]
    # As found: no marker inside, the start-up check passes it, TensorFlow decodes it.
    assert b"\xff" not in entropy
    assert headers.image_problem(noisy_bytes) is None and decodes(noisy_bytes)
    root = image_folder(tmp_path / "photos", {"b/noisy.jpg": noisy_bytes})
    noisy = root / "b" / "noisy.jpg"
    out = tmp_path / "run"
    assert pretrain(tmp_path, monkeypatch, root, out) == 0, capsys.readouterr().err
    log = capsys.readouterr().err
    # Named in one line with libjpeg's warning; the clean files are not named.
    named = re.findall(kept_pattern(noisy), log)
    assert len(named) == 1, log
    warning = named[0]
    assert log.count("Kept ") == 1
    # The check stopped with the training.
    assert "libjpeg check" not in [thread.name for thread in threading.enumerate()]
    # Kept: trained on; the run folder lists it apart from the skipped files.
    summary = json.loads((out / runs.METRICS_JSON).read_text())
    assert summary["train_examples"] == 9 and summary["skipped_files"] == []
    assert summary["kept_with_warnings"] == {str(noisy): warning}
    assert (out / runs.KEPT_WITH_WARNINGS).read_text() == f"{noisy}\t{warning}\n"
    assert not (out / runs.SKIPPED_FILES).exists()
    # Checked once: the folder's listing cache holds each file's result.
    listing = data.load_listing(str(root))
    assert listing.cached
    assert dict(zip(listing.paths, listing.libjpeg)) == {
        path: warning if path == str(noisy) else "" for path in listing.paths}


def test_predict_names_a_jpeg_decoding_with_a_libjpeg_warning(tmp_path, monkeypatch, capsys):
    model, images = predict_folder(
        tmp_path, monkeypatch, {"clean.jpg": jpeg(0), "noisy.jpg": garbled_without_ff(jpeg(98))})
    assert cli.main(["predict", "--from", str(model), str(images), "--json"]) == 0
    captured = capsys.readouterr()
    # Both classified; the noisy one named once on stderr, the clean one not.
    assert [r["image"] for r in json.loads(captured.out)] == [
        str(images / "clean.jpg"), str(images / "noisy.jpg")]
    assert len(re.findall(kept_pattern(images / "noisy.jpg"), captured.err)) == 1
    assert captured.err.count("Kept ") == 1


def test_the_stream_keeps_its_positions_around_a_file_that_fails_to_decode(tmp_path):
    root = image_folder(tmp_path / "photos", {"a/bad.jpg": bad_sos(jpeg(99))})
    source = data.load_source(str(root))
    assert source.size == 9 and not source.skipped
    whole = [batch for batch in data.train_dataset(source, 16, 4, channels=1, seed=3).take(6)]
    assert list(source.undecodable) == [str(root / "a" / "bad.jpg")]
    # A run resumed at batch 3 sees exactly the batches an uninterrupted one sees.
    resumed = data.train_dataset(source, 16, 4, channels=1, seed=3, start_batch=3).take(3)
    for (images, labels), (again, again_labels) in zip(whole[3:], resumed):
        np.testing.assert_array_equal(images.numpy(), again.numpy())
        np.testing.assert_array_equal(labels.numpy(), again_labels.numpy())
    # The evaluation pass leaves it out and counts the 8 others once.
    passes = data.eval_dataset(source, 16, 3, channels=1, crop_fraction=1)
    assert [int(images.shape[0]) for images, _ in passes] == [3, 2, 3]
    assert int(passes.cardinality()) == 3  # known: Keras reads the pass to its end quietly
    # --strict-data: an error naming the file.
    strict = data.load_source(str(root), strict=True)
    with pytest.raises(tf.errors.OpError, match=f"{root / 'a' / 'bad.jpg'} failed to decode: "
                       "jpeg::Uncompress failed.*strict data mode"):
        list(data.train_dataset(strict, 16, 9, channels=1, seed=3).take(1))


def test_a_cmyk_jpeg_is_converted_to_grey_for_a_one_channel_model(tmp_path, monkeypatch, capsys):
    cmyk = jpeg(7, mode="CMYK")
    root = image_folder(tmp_path / "photos", {"b/print.jpg": cmyk})
    assert Image.open(io.BytesIO(cmyk)).mode == "CMYK"
    # Grey from the colours libjpeg gives (as for the GIF, BMP and WebP decoders); PIL's
    # own CMYK conversion agrees within rounding (a level per step, 3 at most).
    grey = decode_pixels(cmyk, 1).numpy()
    np.testing.assert_array_equal(
        grey, tf.image.rgb_to_grayscale(decode_pixels(cmyk, 3)).numpy())
    pil_grey = np.asarray(Image.open(io.BytesIO(cmyk)).convert("RGB").convert("L"))
    difference = np.abs(grey[..., 0].astype(int) - pil_grey)
    assert difference.max() <= 3 and difference.mean() < 1.5

    out = tmp_path / "run"
    assert pretrain(tmp_path, monkeypatch, root, out) == 0, capsys.readouterr().err
    assert json.loads((out / runs.METRICS_JSON).read_text())["skipped_files"] == []
    capsys.readouterr()
    image = str(root / "b" / "print.jpg")
    assert cli.main(["predict", "--from", str(out), image, "--json"]) == 0, capsys.readouterr().err
    (result,) = json.loads(capsys.readouterr().out)
    assert result["image"] == image
    # Serving: the SavedModel takes the file's bytes.
    served = tmp_path / "served"
    assert cli.main(["export", "--from", str(out), "--out", str(served)]) == 0
    scores = tf.saved_model.load(str(served)).signatures["serving_bytes"](
        image_bytes=tf.constant([cmyk]))["probabilities"].numpy()
    np.testing.assert_allclose(
        scores[0], [top["probability"] for top in sorted(result["top_k"],
                                                         key=lambda top: top["class"])],
        rtol=1e-4)


@contextlib.contextmanager
def as_user(name):
    """Runs the block with the effective user `name` (root can take it and give it
    back), or skips the test when this process can do neither that nor be refused a
    read as itself."""
    if os.geteuid() != 0:
        yield
        return
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        pytest.skip(f"running as root without a {name!r} user to be refused a read")
    os.setegid(user.pw_gid)
    os.seteuid(user.pw_uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.fixture
def shared_folder():
    """A folder any user may read (pytest's own are the test user's only)."""
    folder = Path(tempfile.mkdtemp(prefix="keras_vit_bad_images_"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_predict_skips_and_names_a_file_it_may_not_read(shared_folder, monkeypatch, capsys):
    model, images = predict_folder(
        shared_folder, monkeypatch, {f"{i}.jpg": jpeg(i) for i in range(3)})
    locked = images / "1.jpg"
    for path in (shared_folder, images, model, *images.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    locked.chmod(0)
    arguments = ["predict", "--from", str(model), str(images), "--json", "--top-k", "1"]
    assert cli.main(arguments) == 0  # as root: every file read, and the imports done
    capsys.readouterr()
    with as_user("nobody"):
        with pytest.raises(PermissionError):  # as found: this user may not read it
            open(locked, "rb")
        code = cli.main(arguments)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert [r["image"] for r in json.loads(captured.out)] == [str(images / "0.jpg"),
                                                               str(images / "2.jpg")]
    assert f"Skipped an unreadable file: {str(locked)!r} cannot be read: Permission denied" \
        in captured.err


def test_predict_names_a_folder_named_as_an_image_file(tmp_path, monkeypatch, capsys):
    model, images = predict_folder(tmp_path, monkeypatch, {"a.jpg": jpeg(0)})
    (images / "x.jpg").mkdir()
    (images / "x.jpg" / "inside.jpg").write_bytes(jpeg(1))
    assert cli.main(["predict", "--from", str(model), str(images), "--json"]) == 0
    captured = capsys.readouterr()
    assert [r["image"] for r in json.loads(captured.out)] == [str(images / "a.jpg")]
    assert (f"Skipped an unreadable file: {str(images / 'x.jpg')!r} is a folder, not an "
            "image file.") in captured.err


def closed_port():
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tfds_offline_fails_fast_in_one_line(tmp_path, monkeypatch, capsys):
    # Offline as a proxy that refuses every connection makes it: nothing is downloaded.
    proxy = f"http://127.0.0.1:{closed_port()}"
    for variable in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(variable, proxy)
    for variable in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    prepared = tmp_path / "tensorflow_datasets"
    monkeypatch.setenv("TFDS_DATA_DIR", str(prepared))
    assert pretrain(tmp_path, monkeypatch, "tfds:mnist", tmp_path / "run") == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith(
        f"keras-vit pretrain: error: TFDS dataset 'mnist' is not prepared under {prepared} "
        "and cannot be downloaded: the network is unreachable (storage.googleapis.com: ")
    assert "Prepare it where there is a network and set TFDS_DATA_DIR" in line


def test_the_package_brings_what_tfds_imports_to_prepare_a_dataset():
    # TFDS's dataset builder imports importlib_resources (lazily, when it prepares a
    # registered dataset) and does not declare it.
    builder_source = Path(tfds.core.dataset_builder.__file__).read_text()
    assert "import importlib_resources" in builder_source
    with open(ROOT / "pyproject.toml", "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    names = {dependency.split(";")[0].split("<")[0].split(">")[0].split("=")[0].strip()
             .lower().replace("-", "_") for dependency in dependencies}
    assert "importlib_resources" in names
