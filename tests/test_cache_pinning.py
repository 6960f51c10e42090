"""The weights cache pins every file on first use (its SHA-256 and size in the cache's
index.json): a valid checkpoint swapped into the cache later, or a later download that
brings another file, is refused; `keras-vit weights --verify` re-hashes the cache; a
download that does not load into its entry's model names the cached file to delete.
The bucket is a loopback HTTP server (conftest.py) serving files written by save_npz."""

import hashlib
import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
from helpers import ROOT, TINY, bucket_entry, bucket_model

import keras_vit
from keras_vit.cli import main
from keras_vit.weights import download


def outputs(model):
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    return keras.ops.convert_to_numpy(model(x))


def sha(data):
    return hashlib.sha256(data).hexdigest()


def swap_into_cache(bucket, path, seed):
    """Replaces the cached file `path` with another valid checkpoint of the same size."""
    other = bucket.put("replacement.npz", bucket_model(seed=seed))
    assert len(other) == os.path.getsize(path)
    os.replace(bucket.root / "replacement.npz", path)
    return other


def test_a_wrong_architecture_download_names_the_cached_file_to_delete(bucket):
    # The mirror serves a valid checkpoint of another architecture under the entry's path.
    wrong = keras_vit.ViT(image_size=32, num_classes=1000, **dict(TINY, hidden_dim=48))
    bucket.put("test/arch.npz", wrong)
    entry = bucket_entry("test_tiny_32.arch", "test/arch.npz")
    cached = download.cache_path(entry.url)
    advice = (f"The cached file {cached}, downloaded for 'test_tiny_32.arch', is not the "
              "checkpoint the entry describes: delete it (or move it aside) to download it "
              "again.")
    for _ in range(2):  # every later call says it again, from the cache
        with pytest.raises(ValueError, match=r"mis-shaped embedding/kernel: checkpoint "
                                             r"\(8, 8, 3, 48\), model \(8, 8, 3, 32\)") as error:
            keras_vit.pretrained(entry.name)
        assert str(error.value).splitlines()[-1] == advice
    assert bucket.requests == ["/test/arch.npz"]

    # The mirror is corrected; the user deletes the file as told: the right one loads.
    bucket.put("test/arch.npz", bucket_model(seed=1))
    os.remove(cached)
    np.testing.assert_array_equal(outputs(keras_vit.pretrained(entry.name)),
                                  outputs(bucket_model(seed=1)))
    assert bucket.requests == ["/test/arch.npz"] * 2


def test_a_download_with_the_entrys_hash_that_does_not_fit_blames_the_entry(bucket):
    wrong = bucket.put("test/hashed.npz", keras_vit.ViT(image_size=32, num_classes=1000,
                                                        **dict(TINY, num_layers=3)))
    entry = bucket_entry("test_tiny_32.hashed", "test/hashed.npz", sha256=sha(wrong))
    with pytest.raises(ValueError, match="unexpected Transformer/encoderblock_2/") as error:
        keras_vit.pretrained(entry.name, dropout_rate=0.1)
    assert str(error.value).splitlines()[-1] == (
        f"The cached file {download.cache_path(entry.url)} has the SHA-256 of the entry "
        "'test_tiny_32.hashed': it is the entry that does not describe its checkpoint "
        "(unless dropout_rate changed it); register it corrected."
    )


def test_a_valid_checkpoint_swapped_into_the_cache_is_refused(bucket):
    good = bucket.put("test/pinned.npz", bucket_model(seed=1))
    entry = bucket_entry("test_tiny_32.pinned", "test/pinned.npz")  # no SHA-256: the pin's
    keras_vit.pretrained(entry.name)
    cached = download.cached(entry)
    index = os.path.join(download.cache_dir(), "index.json")
    other = swap_into_cache(bucket, cached, seed=2)  # passes every CRC check
    message = (f"The cached file {cached} fails its check: its SHA-256 is {sha(other)} "
               f"({len(other)} bytes), not the {sha(good)} ({len(good)} bytes) of the file "
               f"first downloaded from {entry.url} (pinned in {index}); delete it to download "
               "it again.")
    with pytest.raises(download.DownloadError, match=f"^{re.escape(message)}$"):
        keras_vit.pretrained(entry.name)
    assert bucket.requests == ["/test/pinned.npz"]  # refused, not downloaded again

    # Deleted as told: downloaded again, it is the pinned file, and loads.
    os.remove(cached)
    np.testing.assert_array_equal(outputs(keras_vit.pretrained(entry.name)),
                                  outputs(bucket_model(seed=1)))
    with open(index) as f:
        pins = json.load(f)["files"]
    assert {key: (pin["sha256"], pin["size"], pin["url"]) for key, pin in pins.items()} == {
        "test/pinned.npz": (sha(good), len(good), entry.url)
    }
    assert sorted(os.listdir(os.path.dirname(cached))) == ["pinned.npz"]  # nothing beside it
    # An entry that carries a SHA-256 is checked against it, pinned file or not.
    hashed = bucket_entry("test_tiny_32.pinned", "test/pinned.npz", sha256=sha(other))
    with pytest.raises(download.DownloadError,
                       match=f"its SHA-256 is {sha(good)}, the registry says {sha(other)}"):
        keras_vit.pretrained(hashed.name)


def test_a_later_download_of_another_file_than_the_pinned_one_is_refused(bucket):
    good = bucket.put("test/moved.npz", bucket_model(seed=1))
    entry = bucket_entry("test_tiny_32.moved", "test/moved.npz")
    keras_vit.pretrained(entry.name)
    os.remove(download.cached(entry))  # the user frees some space
    other = bucket.put("test/moved.npz", bucket_model(seed=2))  # the mirror changes its file

    index = os.path.join(download.cache_dir(), "index.json")
    with pytest.raises(download.DownloadError) as error:
        keras_vit.pretrained(entry.name)
    assert str(error.value) == (
        f"The download of {download.download_url(entry.url)} was not kept: its SHA-256 is "
        f"{sha(other)} ({len(other)} bytes), not the {sha(good)} ({len(good)} bytes) of the "
        f"file first downloaded from {entry.url} (pinned in {index}). The file served there "
        f"has changed; if the new one is right, delete {index} (every cached file is pinned "
        "again, as it is then, on its next use)."
    )
    assert download.cached(entry) is None

    os.remove(index)  # as told: the new file is the right one
    np.testing.assert_array_equal(outputs(keras_vit.pretrained(entry.name)),
                                  outputs(bucket_model(seed=2)))


def test_weights_verify_rehashes_every_cached_file(bucket, capsys):
    kept = bucket.put("test/kept.npz", bucket_model(seed=1))
    bucket.put("test/swapped.npz", bucket_model(seed=1))
    bucket.put("test/gone.npz", bucket_model(seed=1))
    for name in ("kept", "swapped", "gone"):
        keras_vit.pretrained(bucket_entry(f"test_tiny_32.{name}", f"test/{name}.npz").name)
    folder = download.cache_dir()
    swapped = os.path.join(folder, "test", "swapped.npz")
    # Swapped keeping the pinned modification time: a load would not read it again.
    mtime = os.stat(swapped).st_mtime_ns
    other = swap_into_cache(bucket, swapped, seed=3)
    os.utime(swapped, ns=(mtime, mtime))
    os.remove(os.path.join(folder, "test", "gone.npz"))
    capsys.readouterr()

    assert main(["weights", "--verify"]) == 1
    lines = capsys.readouterr().out.splitlines()
    index = os.path.join(folder, "index.json")
    assert lines == [
        "missing   test/gone.npz (its next download is checked against its pin)",
        "ok        test/kept.npz",
        f"CHANGED   test/swapped.npz: its SHA-256 is {sha(other)} ({len(other)} bytes), not "
        f"the {sha(kept)} ({len(kept)} bytes) of the file first downloaded from "
        f"{download.registry.OFFICIAL_BASE}test/swapped.npz (pinned in {index}); delete it "
        "to download it again",
        f"{folder}: 1 unchanged, 1 changed, 1 missing.",
    ]

    os.remove(swapped)
    assert main(["weights", "--verify"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"{folder}: 1 unchanged, 0 changed, 2 missing."
    )
    assert main(["weights", "vit_*", "--verify"]) == 2
    assert capsys.readouterr().err == (
        "keras-vit weights: error: --verify checks the whole cache: leave out PATTERN.\n"
    )


def test_verifying_the_cache_needs_no_keras(bucket):
    bucket.put("test/light.npz", bucket_model(seed=1))
    keras_vit.pretrained(bucket_entry("test_tiny_32.light", "test/light.npz").name)
    script = (
        "import sys\n"
        "from keras_vit.weights.cache import verify_cache\n"
        "lines, changed = verify_cache()\n"
        "print(lines[0], changed)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'keras', 'tensorflow'}))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.stdout.splitlines() == ["ok        test/light.npz 0", "[]"], result.stderr


PIN_MANY = """
import os, sys
from keras_vit.weights import cache
folder = os.environ["KERAS_VIT_CACHE"]
while not os.path.exists(os.path.join(folder, "go")):  # both start pinning together
    pass
for i in range(int(sys.argv[2])):
    path = os.path.join(folder, sys.argv[1], f"{i}.npz")
    with open(path, "w") as f:
        f.write(path)
    cache.pin(path, cache.file_sha256(path), "https://example.com/" + path)
"""


def test_two_processes_pinning_at_once_keep_every_pin(tmp_path):
    folder = tmp_path / "cache"
    env = dict(os.environ, PYTHONPATH=str(ROOT), KERAS_VIT_CACHE=str(folder))
    count = 60
    workers = []
    for name in ("a", "b"):
        (folder / name).mkdir(parents=True)
        workers.append(subprocess.Popen([sys.executable, "-c", PIN_MANY, name, str(count)],
                                        cwd=ROOT, env=env))
    (folder / "go").touch()
    assert [worker.wait(timeout=120) for worker in workers] == [0, 0]
    with open(folder / "index.json") as f:
        pins = json.load(f)["files"]
    expected = {f"{name}/{i}.npz" for name in ("a", "b") for i in range(count)}
    assert set(pins) == expected
    for key, pin in pins.items():
        data = str(folder / key).encode()
        assert (pin["sha256"], pin["size"]) == (sha(data), len(data))
