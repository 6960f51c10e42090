"""A user's bad input (a file, a dataset name, a folder) is one line naming it and what
to do, exit code 2, never "unexpected ... bug report" (issue 35, item 11).

Each case is made as a user meets it: a real file written and damaged on disk, a real
TFDS builder, a real read-only folder.
"""

import importlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image
from helpers import tiny_vit

import keras_vit
from keras_vit import cli


def one_line_error(capsys, argv, *expected):
    """Runs the CLI; returns its one error line, checked to hold each of `expected`."""
    assert cli.main(argv) == 2
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    assert "unexpected" not in errors[0], errors[0]
    for text in expected:
        assert text in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def photo(tmp_path):
    path = tmp_path / "photo.png"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(path)
    return str(path)


@pytest.fixture(scope="module")
def official_arrays(tmp_path_factory):
    """The tensors of a tiny model's official `.npz`, as `keras_vit.save_npz` writes it."""
    path = tmp_path_factory.mktemp("npz") / "vit.npz"
    keras_vit.save_npz(tiny_vit(), path)
    with np.load(path) as npz:
        return dict(npz)


def text_member(path, arrays):
    """An .npz with a text file among its arrays (`np.load` returns such a member as bytes)."""
    np.savez(path, **arrays)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("notes.txt", "trained on my photos")
    return "'notes.txt'"


def pickled_member(path, arrays):
    """An .npz whose `cls` is an object array (pickled Python objects)."""
    np.savez(path, **dict(arrays, cls=np.array([{"token": 1}], dtype=object)))
    return "'cls'"


def string_member(path, arrays):
    """An .npz whose `head/bias` holds strings."""
    np.savez(path, **dict(arrays, **{"head/bias": np.array(["x"] * 10)}))
    return "'head/bias'"


@pytest.mark.parametrize("make", [text_member, pickled_member, string_member])
def test_an_npz_member_that_is_not_a_numeric_array_is_named(
    tmp_path, capsys, official_arrays, make
):
    path = tmp_path / "weights.npz"
    member = make(path, official_arrays)
    with pytest.raises(ValueError, match=f"member {member} is not a numeric array"):
        keras_vit.load_pretrained(tiny_vit(), str(path))
    one_line_error(
        capsys,
        ["finetune", "--recipe", "demo", "--from", str(path), "--out", str(tmp_path / "run")],
        str(path), f"member {member} is not a numeric array",
    )


@pytest.mark.parametrize(
    "where, member", [(0.5, "model.weights.h5"), (0.002, "config.json")], ids=["weights", "config"]
)
def test_a_byte_flipped_keras_file_is_named_as_corrupt(tmp_path, capsys, photo, where, member):
    """64 bytes flipped inside a saved model (its weights, or its config.json near the
    start): the zip's directory is intact, the member fails its CRC check."""
    path = tmp_path / "model.keras"
    tiny_vit().save(path)
    data = bytearray(path.read_bytes())
    start = int(len(data) * where) + 120
    data[start:start + 64] = bytes(b ^ 0xFF for b in data[start:start + 64])
    path.write_bytes(bytes(data))
    assert zipfile.is_zipfile(path)
    line = one_line_error(
        capsys, ["predict", "--from", str(path), photo],
        f"{path} is corrupt (Bad CRC-32 for file {member!r}",
    )
    assert "use another checkpoint of the run, or save the model again" in line


class NeedsAbsentPackage(tfds.core.GeneratorBasedBuilder):
    """A dataset whose preparation needs a package that is not installed, as TFDS's own
    builders import theirs (apache_beam, pydub, ...) only when they prepare."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(None, None, 3)),
                "label": tfds.features.ClassLabel(num_classes=2),
            }),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        importlib.import_module("keras_vit_absent_package")

    def _generate_examples(self):
        yield from ()


@pytest.fixture
def saved_model(tmp_path):
    path = tmp_path / "model.keras"
    tiny_vit().save(path)
    return str(path)


def test_a_tfds_dataset_whose_builder_needs_an_absent_package_is_named(
    tmp_path, capsys, monkeypatch, saved_model
):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    argv = ["fewshot", "--from", saved_model, "--data", "tfds:needs_absent_package",
            "--out", str(tmp_path / "fewshot")]
    line = one_line_error(
        capsys, argv, "TFDS dataset 'needs_absent_package'", "'keras_vit_absent_package'",
    )
    assert "pip install keras_vit_absent_package" in line


WEIGHTS = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"


def test_a_cache_folder_that_cannot_be_made_is_named_before_any_download(
    tmp_path, capsys, monkeypatch, photo
):
    """KERAS_VIT_CACHE below a regular file: a folder no user, root included, can create."""
    (tmp_path / "file").write_text("not a folder")
    cache = tmp_path / "file" / "cache"
    monkeypatch.setenv("KERAS_VIT_CACHE", str(cache))
    one_line_error(
        capsys, ["predict", "--weights", WEIGHTS, photo],
        f"The weights cache {cache} cannot be written (Not a directory", "KERAS_VIT_CACHE",
    )


def read_only_mount(folder):
    """`argv` prefix that runs a command with an empty read-only file system on `folder`,
    in a private mount namespace (nothing outside the command sees it); root writes to a
    read-only folder, not to a read-only file system. None where namespaces are refused."""
    if shutil.which("unshare") is None:
        return None
    prefix = ["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o ro tmpfs "$0" && exec "$@"',
              str(folder)]
    probe = subprocess.run([*prefix, "true"], capture_output=True)
    return prefix if probe.returncode == 0 else None


def test_an_empty_read_only_cache_is_named_with_what_to_do(tmp_path, photo):
    """The cache an empty folder on a read-only file system (Errno 30), as found."""
    cache = tmp_path / "cache"
    cache.mkdir()
    prefix = read_only_mount(cache)
    if prefix is None:
        pytest.skip("no mount namespace here (unshare -rm) to make a read-only file system")
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, KERAS_VIT_CACHE=str(cache), PYTHONPATH=str(root))
    run = subprocess.run(
        [*prefix, sys.executable, "-m", "keras_vit", "predict", "--weights", WEIGHTS, photo],
        env=env, capture_output=True, text=True, timeout=600,
    )
    errors = [line for line in run.stderr.splitlines() if ": error: " in line]
    assert run.returncode == 2 and len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
    assert f"The weights cache {cache} cannot be written (Read-only file system" in errors[0]
    assert "set KERAS_VIT_CACHE to a writable folder" in errors[0], errors[0]
