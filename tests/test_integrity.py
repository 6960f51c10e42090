"""Integrity of downloaded weights: a mirror's wrong file is refused against the registry's
SHA-256 and size, a cached file that changed is verified again on its first use, and a
plain http:// download with nothing to check it against is refused. The bucket is a
loopback HTTP server (conftest.py) serving files written by save_npz."""

import hashlib
import os

import keras
import numpy as np
import pytest
from helpers import bucket_entry, bucket_model

import keras_vit
from keras_vit.weights import download


def outputs(model):
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    return keras.ops.convert_to_numpy(model(x))


def test_a_mirror_file_of_another_size_or_hash_is_refused(bucket):
    good = bucket.put("test/good.npz", bucket_model(seed=1))
    digest = hashlib.sha256(good).hexdigest()
    # Another valid checkpoint where the good one should be: it would load without a word.
    other = bucket.put("test/other.npz", bucket_model(seed=2))
    assert len(other) == len(good) and other != good

    swapped = bucket_entry("test_tiny_32.swapped", "test/other.npz", sha256=digest,
                           size=len(good))
    with pytest.raises(download.DownloadError,
                       match=f"its SHA-256 is {hashlib.sha256(other).hexdigest()}, the "
                             f"registry says {digest}"):
        keras_vit.pretrained(swapped.name)
    resized = bucket_entry("test_tiny_32.resized", "test/good.npz", sha256=digest,
                           size=len(good) + 1)
    with pytest.raises(download.DownloadError,
                       match=f"it holds {len(good)} bytes, the registry says {len(good) + 1}"):
        keras_vit.pretrained(resized.name)
    assert download.cached(swapped) is None and download.cached(resized) is None

    right = bucket_entry("test_tiny_32.right", "test/good.npz", sha256=digest, size=len(good))
    np.testing.assert_array_equal(outputs(keras_vit.pretrained(right.name)),
                                  outputs(bucket_model(seed=1)))


@pytest.mark.parametrize("registry_hash", [True, False])
def test_a_cached_file_that_changed_is_verified_again_on_first_use(bucket, registry_hash):
    good = bucket.put("test/kept.npz", bucket_model(seed=1))
    fields = dict(sha256=hashlib.sha256(good).hexdigest()) if registry_hash else {}
    entry = bucket_entry("test_tiny_32.kept", "test/kept.npz", **fields)
    keras_vit.pretrained(entry.name)
    cached = download.cached(entry)
    assert bucket.requests == ["/test/kept.npz"]

    # Touched but unchanged: verified again, and it passes.
    os.utime(cached, ns=(0, 10**18))
    np.testing.assert_array_equal(outputs(keras_vit.pretrained(entry.name)),
                                  outputs(bucket_model(seed=1)))
    if registry_hash:
        # Replaced in the cache by another valid checkpoint.
        bucket.put("replacement.npz", bucket_model(seed=2))
        os.replace(bucket.root / "replacement.npz", cached)
        message = r"its SHA-256 is [0-9a-f]{64}, the registry says"
    else:
        # Cut short in the cache (a disk filled up, a copy interrupted).
        with open(cached, "r+b") as f:
            f.truncate(len(good) // 2)
        message = r"it is not a complete \.npz archive"
    with pytest.raises(download.DownloadError,
                       match=f"^The cached file {cached} fails its check: {message}.*; delete "
                             "it to download it again\\.$"):
        keras_vit.pretrained(entry.name)
    assert bucket.requests == ["/test/kept.npz"]  # refused, not silently downloaded again


def test_plain_http_without_a_hash_is_refused(bucket, monkeypatch):
    entry = bucket_entry("test_tiny_32.plain", "test/plain.npz")
    monkeypatch.setenv(download.MIRROR_ENV, "http://mirror.invalid/vit_models/")
    with pytest.raises(download.DownloadError,
                       match=r"^Refusing to download http://mirror\.invalid/vit_models/test/"
                             r"plain\.npz over plain http:// with no SHA-256 to check it"):
        keras_vit.pretrained(entry.name)
    assert download.cached(entry) is None
