"""Temporary files in shared folders (the weights cache, the listing cache, run folders):
created by `tempfile` under names no other process can predict, so that a file or link
planted at a name derived from the process id is never written through."""

import os
import stat

import numpy as np
from helpers import bucket_entry, bucket_model

import keras_vit
from keras_vit.data.folders import folder_key, load_listing
from keras_vit.utils import files
from keras_vit.weights import download


def plant_link(at, victim):
    """A symbolic link at `at`, where another user of a shared folder could put one."""
    os.makedirs(os.path.dirname(at), exist_ok=True)
    os.symlink(victim, at)


def test_a_download_never_writes_through_a_link_at_a_pid_derived_name(bucket, tmp_path):
    bucket.put("test/planted.npz", bucket_model())
    entry = bucket_entry("test_tiny_32.planted", "test/planted.npz")
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    final = download.cache_path(entry.url)
    folder, name = os.path.split(final)
    # The names earlier versions wrote the download to (".NAME.PID.part") and the
    # temporary name of an atomic write (".tmp-PID-NAME").
    plant_link(os.path.join(folder, f".{name}.{os.getpid()}.part"), victim)
    plant_link(os.path.join(folder, f".tmp-{os.getpid()}-{name}"), victim)

    keras_vit.pretrained(entry.name)
    assert victim.read_bytes() == b"the user's file"
    with np.load(final) as checkpoint:
        assert "cls" in checkpoint.files


def test_the_listing_cache_never_writes_through_a_link_at_a_pid_derived_name(tmp_path):
    images = tmp_path / "images" / "cat"
    images.mkdir(parents=True)
    (images / "a.png").write_bytes(b"not decoded by the listing")
    cache = tmp_path / "cache"
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    path = cache / "listings" / f"{folder_key(str(tmp_path / 'images'))}.json"
    plant_link(f"{path}.{os.getpid()}.tmp", victim)

    load_listing(str(tmp_path / "images"), cache_dir=str(cache))
    assert victim.read_bytes() == b"the user's file"
    assert path.is_file() and not path.is_symlink()


def test_temporary_files_are_new_exclusive_files_with_the_usual_permissions(tmp_path):
    target = tmp_path / "model.keras"
    names = {files.create_temporary(target) for _ in range(20)}
    assert len(names) == 20  # each call a new file
    umask = os.umask(0o022)
    os.umask(umask)
    for name in names:
        assert os.path.dirname(name) == str(tmp_path)
        assert os.path.basename(name).startswith(".tmp-") and name.endswith("-model.keras")
        assert str(os.getpid()) not in os.path.basename(name)[5:].split("-")[0]
        info = os.lstat(name)
        assert stat.S_ISREG(info.st_mode) and info.st_size == 0
        assert stat.S_IMODE(info.st_mode) == 0o666 & ~umask
    assert sorted(files.remove_temporaries(str(tmp_path))) == sorted(names)
