"""TFDS sources on real datasets prepared on disk by TFDS itself, in each file format.

The builders below are defined here and prepared with TFDS's own `download_and_prepare`
(nothing is downloaded). `TinyShapes` is not registered with TFDS, so keras-vit finds it
by name alone from the data folder, as a user's fresh process finds a prepared dataset.
"""

import io
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

import keras_vit
from keras_vit import cli, data

FORMATS = ("tfrecord", "array_record")
CLASSES = ["red", "green", "blue"]


def shape_examples(count, seed, labelled=True):
    """`(key, example)` pairs: small images tinted by their class, JPEG and PNG mixed;
    unlabelled examples have label -1, as TFDS writes imagenet2012's test images."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        label = i % 3
        pixels = rng.integers(0, 60, (10 + i % 5, 12, 3), dtype=np.uint8)
        pixels[..., label] += 180
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG" if i % 2 else "JPEG")
        yield i, {"image": buffer.getvalue(), "label": label if labelled else -1}


def shape_info(builder):
    return tfds.core.DatasetInfo(
        builder=builder,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(None, None, 3)),
            "label": tfds.features.ClassLabel(names=CLASSES),
        }),
        supervised_keys=("image", "label"),
    )


class TinyShapes(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """48 train and 12 validation images in 3 classes; 6 unlabelled test images."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return shape_info(self)

    def _split_generators(self, dl_manager):
        return {
            "train": shape_examples(48, 0),
            "validation": shape_examples(12, 1),
            "test": shape_examples(6, 2, labelled=False),
        }

    def _generate_examples(self):  # Unused: the splits above are generators already.
        raise NotImplementedError


class TinyManual(tfds.core.GeneratorBasedBuilder):
    """A dataset whose images the user downloads by hand, as for imagenet2012."""

    VERSION = tfds.core.Version("1.0.0")
    MANUAL_DOWNLOAD_INSTRUCTIONS = """\
    manual_dir should contain tiny_manual_images.npz.
    Ask the tiny shapes office for it.
    """

    def _info(self):
        return shape_info(self)

    def _split_generators(self, dl_manager):
        images = np.load(dl_manager.manual_dir / "tiny_manual_images.npz")["seed"]
        return {"train": shape_examples(9, int(images))}

    def _generate_examples(self):
        raise NotImplementedError


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory):
    """`{file format: a TFDS data folder holding tiny_shapes prepared in that format}`."""
    dirs = {}
    for file_format in FORMATS:
        root = tmp_path_factory.mktemp(file_format)
        TinyShapes(data_dir=str(root), file_format=file_format).download_and_prepare()
        dirs[file_format] = str(root)
    return dirs


def test_both_file_formats_read_the_same_records_and_slices(data_dirs):
    expected = list(shape_examples(48, 0))
    for file_format, root in data_dirs.items():
        assert tfds.builder("tiny_shapes", data_dir=root).info.file_format.value == file_format
        train = data.load_source("tfds:tiny_shapes", data_dir=root)
        assert (train.size, train.num_classes, train.class_names) == (48, 3, CLASSES)
        records = sorted(
            (label, key) for key, label in train.records.as_numpy_iterator()
        )
        assert records == sorted((ex["label"], ex["image"]) for _, ex in expected)
        # The paper's held-out validation: the two slices partition the train split.
        head = data.load_source("tfds:tiny_shapes:train[:75%]", data_dir=root)
        tail = data.load_source("tfds:tiny_shapes:train[75%:]", data_dir=root)
        assert (head.size, tail.size) == (36, 12)
        sliced = [key for source in (head, tail) for key, _ in source.records.as_numpy_iterator()]
        assert sliced == [key for key, _ in train.records.as_numpy_iterator()]
    with pytest.raises(data.NoSplitError, match="no split 'val'.*train, validation, test"):
        data.load_source("tfds:tiny_shapes:val", data_dir=root)


def test_an_unlabelled_test_split_gives_way_to_validation_or_is_refused(data_dirs, caplog):
    root = data_dirs["array_record"]
    # Evaluation's default split: test, here unlabelled, so validation.
    assert data.load_source("tfds:tiny_shapes", "test", data_dir=root).size == 12
    assert "its test split has no labels; evaluating on its validation split" in caplog.text
    with pytest.raises(ValueError, match="split 'test' has no labels .*train, validation, test"):
        data.load_source("tfds:tiny_shapes:test", data_dir=root)


def test_array_record_stream_equals_tfrecord_stream_and_resumes_exactly(data_dirs):
    def stream(file_format, start):
        source = data.load_source("tfds:tiny_shapes", data_dir=data_dirs[file_format])
        batches = data.train_dataset(source, 16, 8, seed=5, start_batch=start).take(8 - start)
        return [images.numpy() for images, _ in batches]

    # 8 batches of 8 cross the 48-image epoch boundary, where the stream reshuffles.
    full = stream("array_record", 0)
    np.testing.assert_array_equal(np.stack(full), np.stack(stream("tfrecord", 0)))
    np.testing.assert_array_equal(np.stack(full[5:]), np.stack(stream("array_record", 5)))


def test_naflex_batches_from_tfds_take_each_image_at_its_aspect_and_resume(data_dirs):
    """NaFlex batches of a TFDS dataset: the eval pass gives `naflex_inputs` of the
    split's images (grids and masks exactly, pixels within a grey level: TensorFlow's
    resize in float, PIL's in 8-bit), and a packed training stream started at batch 3
    is the uninterrupted one from there, in both file formats."""
    from keras_vit.data.naflex import NaFlexLayout

    root = data_dirs["tfrecord"]  # which TFDS's own as_dataset reads
    source = data.load_source("tfds:tiny_shapes", "validation", data_dir=root)
    batches = list(data.eval_dataset(source, None, 4, naflex=NaFlexLayout(2, 16)))
    # The stored files, decoded by PIL (TFDS's own decoder reads JPEGs less accurately).
    split = tfds.as_numpy(TinyShapes(data_dir=root).as_dataset(
        split="validation", decoders={"image": tfds.decode.SkipDecoding()}))
    examples = [(np.asarray(Image.open(io.BytesIO(e["image"])).convert("RGB")), e["label"])
                for e in split]
    images, labels = [image for image, _ in examples], [label for _, label in examples]
    assert len({image.shape for image in images}) > 1  # the aspects differ
    expected = keras_vit.naflex_inputs(images, patch_size=2, max_num_patches=16)
    got = {key: np.concatenate([x[key].numpy() for x, _ in batches]) for key in expected}
    np.testing.assert_array_equal(got["spatial_shapes"], expected["spatial_shapes"])
    np.testing.assert_array_equal(got["patch_mask"], expected["patch_mask"])
    np.testing.assert_allclose(got["patches"], expected["patches"], rtol=0, atol=2 / 255 + 1e-6)
    assert np.concatenate([y.numpy() for _, y in batches]).argmax(-1).tolist() == labels

    packed = NaFlexLayout(2, 16, images_per_row=2)

    def stream(file_format, start):
        train = data.load_source("tfds:tiny_shapes", data_dir=data_dirs[file_format])
        return [keras.tree.map_structure(lambda t: t.numpy(), batch) for batch in
                data.train_dataset(train, None, 4, seed=5, start_batch=start,
                                   naflex=packed).take(8 - start)]

    full = stream("array_record", 0)
    assert full[0][0]["spatial_shapes"].shape == (2, 2, 2)  # 4 images a batch, 2 a row
    for a, b in zip(full[3:] + full, stream("array_record", 3) + stream("tfrecord", 0)):
        keras.tree.map_structure(np.testing.assert_array_equal, a, b)


def test_an_unknown_dataset_is_one_line_naming_the_data_folder(tmp_path):
    with pytest.raises(ValueError, match=f"no dataset 'tiny_nothing'.*under {tmp_path}"):
        data.load_source("tfds:tiny_nothing", data_dir=str(tmp_path))


def test_manual_download_names_the_folder_and_the_files(tmp_path):
    manual = tmp_path / "downloads" / "manual"
    for name, files in [
        ("tiny_manual", "tiny_manual_images.npz"),
        ("imagenet2012", "ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar"),
    ]:
        with pytest.raises(ValueError) as error:
            data.load_source(f"tfds:{name}", data_dir=str(tmp_path))
        message = str(error.value)
        assert "\n" not in message and f"put its files in {manual} " in message
        assert files in message
    # With the file in place, TFDS prepares the dataset and it loads.
    manual.mkdir(parents=True)
    np.savez(manual / "tiny_manual_images.npz", seed=7)
    source = data.load_source("tfds:tiny_manual", data_dir=str(tmp_path))
    labels = sorted(int(label) for _, label in source.records.as_numpy_iterator())
    assert (source.size, labels) == (9, [0, 0, 0, 1, 1, 1, 2, 2, 2])


PRETRAIN = [
    "pretrain", "--recipe", "demo", "--data", "tfds:tiny_shapes", "--set", "model.image_size=16",
    "--set", "model.channels=3", "--set", "data.batch_size=16", "--set", "schedule.epochs=2",
    "--set", "schedule.warmup_updates=1", "--set", "checkpointing.tensorboard=false",
    "--set", "distribution.jit_compile=off",
]


@pytest.mark.slow
def test_pretrain_by_name_with_data_dir_set(data_dirs, tmp_path):
    out = tmp_path / "run"
    argv = PRETRAIN + ["--set", f"data.data_dir={data_dirs['tfrecord']}", "--out", str(out)]
    assert cli.main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["train_examples"], metrics["eval_examples"]) == (48, 12)
    # Classes differ by tint: labels that reached the model out of step with their
    # images would leave the accuracy near 1/3.
    assert metrics["final"]["top1"] >= 0.9
    assert len(metrics["history"]["val_loss"]) == 2


@pytest.mark.slow
def test_pretrain_by_name_from_tfds_data_dir_in_a_fresh_process(data_dirs, tmp_path):
    """The user's path: a new `keras-vit` process, the dataset found through TFDS_DATA_DIR."""
    out = tmp_path / "run"
    env = dict(os.environ, TFDS_DATA_DIR=data_dirs["array_record"])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "keras_vit", *PRETRAIN, "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["train_examples"], metrics["eval_examples"]) == (48, 12)
    assert metrics["final"]["top1"] >= 0.9
    config = json.loads((out / "config.json").read_text())
    assert config["data"]["source"] == "tfds:tiny_shapes" and config["data"]["data_dir"] is None
