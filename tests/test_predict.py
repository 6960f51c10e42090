"""Pretrained weights by name, offline: a loopback HTTP server stands in for the bucket
(through KERAS_VIT_WEIGHTS_MIRROR) and serves files written by save_npz; the cache,
its integrity checks, `keras_vit.pretrained`, `ViT(weights=...)`, `--from NAME` and the
`keras-vit weights` / `predict` commands."""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import TINY, bucket_entry, bucket_model, randomise_weights, tiny_vit

import keras_vit
from keras_vit import cli
from keras_vit.data import read_images
from keras_vit.training import runs
from keras_vit.weights import download


def test_first_load_downloads_second_is_a_cache_hit(bucket, tmp_path):
    source = bucket_model()
    bucket.put("test/tiny.npz", source)
    entry = bucket_entry("test_tiny_32.loopback", "test/tiny.npz")
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")

    model = keras_vit.pretrained(entry.name)
    assert bucket.requests == ["/test/tiny.npz"]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(x)),
                                  keras.ops.convert_to_numpy(source(x)))
    cached = tmp_path / "cache" / "test" / "tiny.npz"
    assert download.cached(entry) == str(cached)
    # No partial file left, nothing beside the file (its pin is in the cache's index).
    assert sorted(os.listdir(cached.parent)) == ["tiny.npz"]

    again = keras_vit.pretrained(entry.name)
    assert bucket.requests == ["/test/tiny.npz"]  # no second request
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(again(x)),
                                  keras.ops.convert_to_numpy(source(x)))


@pytest.mark.parametrize("case", ["truncated file", "connection cut short", "wrong hash"])
def test_incomplete_or_corrupt_downloads_are_refused_and_not_cached(bucket, case):
    data = bucket.put("test/whole.npz", bucket_model())
    if case == "truncated file":  # the server sends all it has: a cut-off archive
        (bucket.root / "test" / "cut.npz").write_bytes(data[: len(data) * 2 // 3])
        entry = bucket_entry("test_tiny_32.cut", "test/cut.npz")
        message = r"incomplete or corrupt and was not kept: it is not a complete \.npz archive"
    elif case == "connection cut short":  # announces the whole length, sends half
        os.makedirs(bucket.root / "short", exist_ok=True)
        (bucket.root / "short" / "half.npz").write_bytes(data)
        entry = bucket_entry("test_tiny_32.short", "short/half.npz")
        message = r"Cannot download .*/short/half\.npz .*retrieval incomplete"
    else:
        entry = bucket_entry("test_tiny_32.hash", "test/whole.npz", sha256="0" * 64)
        message = "its SHA-256 is [0-9a-f]{64}, the registry says 0000"
    with pytest.raises(download.DownloadError, match=message):
        keras_vit.pretrained(entry.name)
    assert download.cached(entry) is None
    folder = os.path.dirname(download.cache_path(entry.url))
    assert os.listdir(folder) == []  # the partial download is gone too


def test_offline_cached_loads_uncached_fails_with_one_line(bucket, tmp_path, capsys):
    source = bucket_model()
    bucket.put("test/kept.npz", source)
    bucket.put("test/missing.npz", source)
    kept = bucket_entry("test_tiny_32.kept", "test/kept.npz")
    missing = bucket_entry("test_tiny_32.missing", "test/missing.npz")
    keras_vit.pretrained(kept.name)
    bucket.stop()

    x = np.ones((1, 32, 32, 3), "float32")
    model = keras_vit.pretrained(kept.name)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(x)),
                                  keras.ops.convert_to_numpy(source(x)))
    target = tmp_path / "cache" / "test" / "missing.npz"
    with pytest.raises(download.DownloadError) as error:
        keras_vit.pretrained(missing.name)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"Cannot download {os.environ[download.MIRROR_ENV]}test/missing.npz (")
    assert message.endswith(f"a copy placed at {target} is used without downloading.")

    image = tmp_path / "grey.png"
    tf.io.write_file(str(image), tf.io.encode_png(tf.fill([8, 8, 3], tf.constant(128, tf.uint8))))
    assert cli.main(["predict", "--weights", missing.name, str(image)]) == 2
    err = capsys.readouterr().err  # after get_file's "Downloading data from ..." line
    assert err.splitlines()[-1] == f"keras-vit predict: error: {message}"
    assert "Traceback" not in err

    # A copy put where the message says is picked up, still without the network.
    os.makedirs(target.parent, exist_ok=True)
    (bucket.root / "test" / "missing.npz").rename(target)
    model = keras_vit.pretrained(missing.name)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(x)),
                                  keras.ops.convert_to_numpy(source(x)))


def _write_image(path, rgb):
    pixels = tf.constant(np.tile(np.array(rgb, np.uint8), (40, 56, 1)))
    tf.io.write_file(str(path), tf.io.encode_png(pixels))
    return str(path)


def test_predict_names_the_class_the_test_put_in_the_head(bucket, tmp_path, capsys):
    red = _write_image(tmp_path / "red.png", (255, 0, 0))
    blue = _write_image(tmp_path / "blue.png", (0, 0, 255))
    model = bucket_model(seed=2)
    # Features before the head, for the images as predict preprocesses them (whole image,
    # bilinear, [-1, 1]); the head then scores (f - centre) . (f_red - f_blue): positive for
    # red as class 207, for blue as class 1.
    features = keras.Model(model.input, model.get_layer("pool").output)
    f_red, f_blue = keras.ops.convert_to_numpy(features(read_images([red, blue], 32)))
    direction, centre = f_red - f_blue, (f_red + f_blue) / 2
    kernel = np.zeros((32, 1000), "float32")
    bias = np.zeros(1000, "float32")
    kernel[:, 207], bias[207] = 20 * direction, -20 * centre @ direction
    kernel[:, 1], bias[1] = -20 * direction, 20 * centre @ direction
    model.get_layer("head").set_weights([kernel, bias])
    bucket.put("test/colours.npz", model)
    entry = bucket_entry("test_tiny_32.colours", "test/colours.npz")

    assert cli.main(["predict", "--weights", entry.name, red, blue, "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == red and lines[3] == blue
    assert lines[1].endswith("  golden retriever")
    assert lines[4].endswith("  goldfish, Carassius auratus")

    assert cli.main(["predict", "--weights", entry.name, red, blue, "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["top_k"][0]["class"] for r in results] == [207, 1]
    assert [len(r["top_k"]) for r in results] == [5, 5]
    logits = keras.ops.convert_to_numpy(model(read_images([red], 32)))[0].astype("float64")
    softmax = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert results[0]["top_k"][0]["probability"] == pytest.approx(softmax[207], rel=1e-5)
    assert bucket.requests == ["/test/colours.npz"]
    # In bfloat16: the same classes, the probabilities within its rounding.
    assert cli.main(["predict", "--weights", entry.name, red, blue, "--json",
                     "--precision", "bfloat16"]) == 0
    half = json.loads(capsys.readouterr().out)
    assert [r["top_k"][0]["class"] for r in half] == [207, 1]
    assert half[0]["top_k"][0]["probability"] == pytest.approx(softmax[207], rel=2**-4)
    assert half[0]["top_k"][0]["probability"] != results[0]["top_k"][0]["probability"]
    with pytest.raises(SystemExit):  # argparse's refusal
        cli.main(["predict", "--weights", entry.name, red, "--precision", "half"])
    assert "argument --precision: invalid choice: 'half'" in capsys.readouterr().err

    # The same from Python, and from a trained model's .keras file (`--from`).
    assert keras_vit.classify(keras_vit.pretrained(entry.name), red, top_k=1)[0]["top_k"][0][
        "label"] == "golden retriever"
    saved = str(tmp_path / "colours.keras")
    model.save(saved)
    assert cli.main(["predict", "--from", saved, blue, "--top-k", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith("  class 1")


def test_vit_weights_is_load_pretrained_and_from_accepts_registry_names(bucket):
    source = bucket_model()
    bucket.put("test/finetune.npz", source)
    entry = bucket_entry("test_tiny_32.finetune", "test/finetune.npz")

    model = keras_vit.ViT(weights=entry.name, image_size=48, num_classes=5)
    reference = keras_vit.ViT(image_size=48, num_classes=5, **TINY)
    report = keras_vit.load_pretrained(reference, download.cached(entry))
    assert report.messages == [
        "the checkpoint's head has 1000 classes, the model 5: the head is reset to zeros.",
        "position embedding resampled from a 4x4 to a 6x6 patch grid (bilinear_align_corners).",
    ]
    x = np.random.default_rng(1).uniform(-1, 1, (2, 48, 48, 3)).astype("float32")
    features = [keras.Model(m.input, m.get_layer("pool").output) for m in (model, reference)]
    np.testing.assert_array_equal(*[keras.ops.convert_to_numpy(f(x)) for f in features])
    assert not np.any(keras.ops.convert_to_numpy(model.get_layer("head").kernel))
    # Without image_size and num_classes: the checkpoint's own model.
    same = keras_vit.ViT(weights=entry.name)
    assert same.input_shape == (None, 32, 32, 3) and same.output_shape == (None, 1000)

    # keras-vit finetune --from NAME: what the engine calls with init_from.
    assert runs.resolve_from(entry.name).path == download.cached(entry)
    fine = keras_vit.ViT(image_size=32, num_classes=10, **TINY)
    message = runs.load_weights(fine, entry.name)
    assert message.startswith(f"loaded {entry.name}:") and "head is reset" in message
    assert bucket.requests == ["/test/finetune.npz"]


def test_weights_command_lists_entries_and_what_is_cached(bucket, capsys):
    bucket.put("test/listed.npz", bucket_model())
    entry = bucket_entry("test_tiny_32.listed", "test/listed.npz", top1=12.5, size_mib=0.4)
    assert cli.main(["weights", "test_tiny_32.listed"]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    assert header.split() == ["name", "variant", "res", "classes", "data", "top-1", "size", "cached"]
    assert row.split() == [entry.name, "custom", "32", "1000", "ImageNet-21k", ">",
                           "ImageNet-1k", "12.50", "0", "MiB", "no"]
    keras_vit.pretrained(entry.name)
    assert cli.main(["weights", "test_tiny_32.listed"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[-1] == "yes"

    assert cli.main(["weights", "B/16"]) == 0
    out = capsys.readouterr().out
    assert "vit_base_patch16_384.augreg_recommended_in21k_ft_in1k" in out and "85.49" in out
    assert cli.main(["weights", "no_such_weights"]) == 2
    assert "No registered weights match 'no_such_weights'" in capsys.readouterr().err


def test_hub_sources_without_huggingface_hub_fail_with_one_line(monkeypatch, capsys):
    # None in sys.modules is how Python reports a package that is not installed.
    monkeypatch.setitem(__import__("sys").modules, "huggingface_hub", None)
    message = ('Loading hf: or timm: weights needs huggingface_hub, which is not installed: '
               'pip install "keras3-vit[hf]".')
    with pytest.raises(ImportError) as raised:
        keras_vit.ViT(weights="hf:google/vit-base-patch16-224", image_size=32, **TINY)
    assert str(raised.value) == message
    assert cli.main(["fewshot", "--from", "timm:vit_tiny_patch16_224.augreg_in21k"]) == 2
    assert capsys.readouterr().err == f"keras-vit fewshot: error: {message}\n"


def test_classify_runs_a_dynamic_size_model_at_its_trained_size(tmp_path):
    dynamic = tiny_vit(dynamic_image_size=True)
    randomise_weights(dynamic, seed=0)
    fixed = tiny_vit()
    fixed.set_weights(dynamic.get_weights())
    path = str(tmp_path / "image.png")
    pixels = np.random.default_rng(0).integers(0, 256, (50, 40, 3), dtype="uint8")
    tf.io.write_file(path, tf.io.encode_png(pixels))
    assert keras_vit.classify(dynamic, path, top_k=3) == keras_vit.classify(fixed, path, top_k=3)


@pytest.mark.parametrize("keras_home", [None, "keras_home"])
def test_the_cache_defaults_to_keras_folder_with_no_variable_set(tmp_path, keras_home):
    """As a user meets it: an empty HOME, no KERAS_VIT_* variable (a fresh process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERAS_VIT_", "KERAS_HOME"))}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    expected = tmp_path / ".keras" / "models" / "keras_vit"
    if keras_home:
        env["KERAS_HOME"] = str(tmp_path / keras_home)
        expected = tmp_path / keras_home / "models" / "keras_vit"
    result = subprocess.run([sys.executable, "-m", "keras_vit", "weights", "vit_base_patch16_224*"],
                            env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"Cache: {expected} (KERAS_VIT_CACHE)" in result.stdout
