"""A user's bad input (a file, a dataset name, a folder) is one line naming it and what
to do, exit code 2, never "unexpected ... bug report" (issue 35, item 11).

Each case is made as a user meets it: a real file written and damaged on disk, a real
TFDS builder, a real read-only folder.
"""

import importlib
import importlib.util
import zipfile

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image
from conftest import tiny_vit

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
def test_an_npz_member_that_is_not_a_numeric_array_is_named(tmp_path, capsys, official_arrays, make):
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
def test_a_byte_flipped_keras_file_is_named_as_corrupt(tmp_path, capsys, where, member):
    """64 bytes flipped inside a saved model (its weights, or its config.json near the
    start): the zip's directory is intact, the member fails its CRC check."""
    path = tmp_path / "model.keras"
    tiny_vit().save(path)
    data = bytearray(path.read_bytes())
    start = int(len(data) * where) + 120
    data[start:start + 64] = bytes(b ^ 0xFF for b in data[start:start + 64])
    path.write_bytes(bytes(data))
    assert zipfile.is_zipfile(path)
    image = tmp_path / "photo.png"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(image)
    line = one_line_error(
        capsys, ["predict", "--from", str(path), str(image)], f"{path} is corrupt (Bad CRC-32 for file {member!r}",
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


@pytest.mark.skipif(
    importlib.util.find_spec("importlib_resources") is not None,
    reason="TFDS has its dependencies here: preparing mnist would download it",
)
def test_preparing_a_tfds_dataset_without_a_tfds_dependency_is_one_line(
    tmp_path, capsys, monkeypatch, saved_model
):
    """As found: TFDS (through etils) imports `importlib_resources` when it prepares one of
    its own datasets, and nothing installs it; nothing is downloaded before that."""
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    argv = ["fewshot", "--from", saved_model, "--data", "tfds:mnist",
            "--out", str(tmp_path / "fewshot")]
    one_line_error(capsys, argv, "TFDS dataset 'mnist'", "pip install importlib_resources")
