"""`keras-vit export`, `visualize` and `probe` on trained runs and saved models."""

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import randomise_weights, tiny_vit

import keras_vit
from keras_vit import cli
from keras_vit import data
from keras_vit.training.config import TrainConfig
from keras_vit.training.engine import train


FIXTURE_RUN = Path(__file__).resolve().parent / "fixtures" / "run_v0_1_0"  # keras-vit 0.1


def _png(path, image):
    tf.io.write_file(str(path), tf.io.encode_png(image))
    return str(path)


@pytest.fixture(scope="module")
def hybrid_run(tmp_path_factory):
    """A tiny hybrid (ResNet root + one bottleneck stage) trained by the engine with the
    paper's sigmoid loss: hybrids go through the same training and export paths."""
    out = tmp_path_factory.mktemp("hybrid") / "run"
    config = TrainConfig(
        model=dict(
            variant="custom", image_size=16, channels=3,
            kwargs=dict(patch_size=1, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32,
                        resnet_stages=(1,)),
        ),
        data=dict(batch_size=32, inception_crop=False, random_flip=False),
        optimization=dict(loss="sigmoid"),
        schedule=dict(epochs=3, micro_batches_per_epoch=6, learning_rate=3e-3),
        evaluation=dict(enabled=False, crop_fraction=0.875),
        checkpointing=dict(tensorboard=False),
        out=str(out),
    )
    result = train(config, verbose=0)
    return out, result


def test_hybrid_trains_through_the_engine(hybrid_run):
    _, result = hybrid_run
    losses = result.history["loss"]
    assert len(losses) == 3 and np.all(np.isfinite(losses))
    assert losses[-1] < losses[0]
    assert any(isinstance(layer, keras.layers.Conv2D) for layer in result.model._flatten_layers())


def test_export_command_serves_the_runs_probabilities(hybrid_run, tmp_path):
    run, result = hybrid_run
    labels = [f"digit {i}" for i in range(10)]
    (tmp_path / "labels.txt").write_text("\n".join(labels) + "\n")
    out = tmp_path / "served"
    code = cli.main(["export", "--from", str(run), "--out", str(out),
                     "--labels", str(tmp_path / "labels.txt"), "--top-k", "3"])
    assert code == 0
    record = json.loads((out / "assets.extra" / "keras_vit.json").read_text())
    assert record["activation"] == "sigmoid"  # from the run's loss
    assert record["crop_fraction"] == 0.875  # from the run's evaluation.crop_fraction
    assert record["metadata"]["train_config"]["optimization"]["loss"] == "sigmoid"

    # 20x24 images as the run's evaluation sees them: the short side to 16 / 0.875 =
    # 18.3 -> 18 pixels (the long side to 21.9 -> 22), then the central 16x16.
    images = np.random.default_rng(0).integers(0, 256, (5, 20, 24, 3), dtype="uint8")
    cropped = tf.image.resize(images, (18, 22), method="bilinear")[:, 1:17, 3:19].numpy()
    served = tf.saved_model.load(str(out)).signatures["serving_default"](images=tf.constant(images))
    logits = keras.ops.convert_to_numpy(result.model(keras_vit.preprocess(cropped)))
    expected = 1 / (1 + np.exp(-logits.astype("float64")))
    np.testing.assert_allclose(served["probabilities"].numpy(), expected, rtol=0, atol=1e-5)
    top = np.argsort(-expected, axis=1)[:, :3]
    np.testing.assert_array_equal(served["top_k_indices"].numpy(), top)
    assert [[s.decode() for s in row] for row in served["top_k_labels"].numpy()] == [
        [labels[i] for i in row] for row in top
    ]


def test_export_command_names_a_label_file_of_the_wrong_length(hybrid_run, tmp_path, capsys):
    run, _ = hybrid_run
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    code = cli.main(["export", "--from", str(run), "--out", str(tmp_path / "x"),
                     "--labels", str(tmp_path / "labels.txt")])
    assert code != 0
    error = capsys.readouterr().err
    assert "2" in error and "10" in error and "Traceback" not in error


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny.keras"
    model = tiny_vit(image_size=16, patch_size=4, channels=1)
    randomise_weights(model, seed=0, scale=0.3)  # non-uniform attention, non-zero head
    model.save(path)
    return model, str(path)


def test_read_images_equals_the_eval_preprocessing(tmp_path):
    image = np.random.default_rng(1).integers(0, 256, (24, 20, 1), dtype="uint8")
    path = _png(tmp_path / "digit.png", image)
    whole = tf.image.resize(tf.cast(image, tf.float32), (16, 16), method="bilinear")
    np.testing.assert_allclose(
        data.read_images([path], 16, channels=1)[0], whole.numpy() / 127.5 - 1, atol=1e-5
    )
    # Short side 20 -> 16 and long side 24 -> 19, then the central 16 rows (crop 1).
    read = data.read_images([path], 16, channels=1, crop_fraction=1.0)
    resized = tf.image.resize(tf.cast(image, tf.float32), (19, 16), method="bilinear")[1:17]
    np.testing.assert_allclose(read[0], resized.numpy() / 127.5 - 1, atol=1e-5)


def test_visualize_command_draws_every_figure(saved_model, tmp_path, capsys):
    _, path = saved_model
    image = np.random.default_rng(2).integers(0, 256, (30, 24, 3), dtype="uint8")
    png = _png(tmp_path / "image.png", image)
    assert cli.main(["visualize", "--from", path, "--image", png, "--out", str(tmp_path / "f")]) == 0
    for name in ("attention", "distance", "position", "filters"):
        figure = tf.io.decode_png(tf.io.read_file(str(tmp_path / "f" / f"{name}.png")))
        assert figure.shape[0] > 100 and figure.shape[1] > 100
    assert "attention:" in capsys.readouterr().out


def test_visualize_command_names_a_missing_image(saved_model, tmp_path, capsys):
    _, path = saved_model
    missing = str(tmp_path / "nope.png")
    assert cli.main(["visualize", "--from", path, "--image", missing, "--out", str(tmp_path)]) != 0
    error = capsys.readouterr().err
    assert missing in error and "Traceback" not in error


def test_probe_command_writes_curves_whose_clean_accuracy_is_the_models(saved_model, tmp_path):
    model, path = saved_model
    out = tmp_path / "probes"
    code = cli.main(["probe", "--from", path, "--data", "digits", "--out", str(out),
                     "--drop", "0,0.5", "--grids", "2,4"])
    assert code == 0
    results = json.loads((out / "probes.json").read_text())
    assert sorted(results["occlusion"]) == ["0.0", "0.5"] and sorted(results["shuffle"]) == ["2", "4"]
    test = data.eval_dataset(data.load_source("digits", "test"), 16, 360, channels=1, crop_fraction=1)
    images, labels = next(iter(test))
    predicted = keras.ops.convert_to_numpy(model(images.numpy())).argmax(-1)
    assert results["examples"] == 360
    assert results["accuracy"] == pytest.approx(np.mean(predicted == labels.numpy().argmax(-1)))
    assert results["occlusion"]["0.0"] == pytest.approx(results["accuracy"])
    tf.io.decode_png(tf.io.read_file(str(out / "probes.png")))


@pytest.mark.parametrize("flag, value", [("--drop", "0,1.5"), ("--drop", "half"), ("--grids", "0")])
def test_probe_command_names_bad_lists(saved_model, tmp_path, capsys, flag, value):
    _, path = saved_model
    assert cli.main(["probe", "--from", path, "--out", str(tmp_path), flag, value]) != 0
    error = capsys.readouterr().err
    assert flag in error and value in error


def test_a_version_0_1_run_exports_and_probes_as_it_was_trained(tmp_path):
    """A run folder written by keras-vit 0.1 (flat config.json): export and probe read
    its loss, eval crop and classes, and see the test accuracy its run reported."""
    out = tmp_path / "served"
    assert cli.main(["export", "--from", str(FIXTURE_RUN), "--out", str(out)]) == 0
    record = json.loads((out / "assets.extra" / "keras_vit.json").read_text())
    assert record["activation"] == "sigmoid" and record["crop_fraction"] == 1.0
    assert record["metadata"]["train_config"]["data"]["classes"] == "0-4"
    probes = tmp_path / "probes"
    assert cli.main(["probe", "--from", str(FIXTURE_RUN), "--out", str(probes),
                     "--drop", "0", "--grids", "2"]) == 0
    results = json.loads((probes / "probes.json").read_text())
    reported = json.loads((FIXTURE_RUN / "metrics.json").read_text())
    assert results["examples"] == reported["eval_examples"] == 180  # digits 0-4 only
    assert results["accuracy"] == pytest.approx(reported["final"]["top1"], abs=1e-6)


def test_probe_command_scores_the_class_range_it_is_given(tmp_path, capsys):
    """`--data digits --classes 0-4` scores a run trained on digits 0-4 on those digits
    (what the run reported), not on all ten; the printed line names the class count."""
    probes = tmp_path / "probes"
    assert cli.main(["probe", "--from", str(FIXTURE_RUN), "--data", "digits", "--classes", "0-4",
                     "--out", str(probes), "--drop", "0", "--grids", "2"]) == 0
    results = json.loads((probes / "probes.json").read_text())
    reported = json.loads((FIXTURE_RUN / "metrics.json").read_text())
    assert results["examples"] == reported["eval_examples"] == 180
    assert results["accuracy"] == pytest.approx(reported["final"]["top1"], abs=1e-6)
    assert "digits, 5 classes: 180 images" in capsys.readouterr().out
