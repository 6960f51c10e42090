"""Run folders wherever a run is accepted: what `pretrain`, `demo` and `fewshot` write is
taken by `predict`, `export`, `fewshot`, `visualize`, `probe` and `finetune --from` (or
named as the wrong folder in one line), the run's class names reach `predict`, and
`predict` classifies folders and glob patterns in batches."""

import csv
import io
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import cli
from keras_vit.training import runs

ROOT = Path(__file__).resolve().parents[1]
COLOURS = {"bird": (250, 200, 0), "cat": (200, 30, 30), "dog": (20, 60, 220)}
SHORT = [
    "--set", "schedule.epochs=2", "--set", "schedule.micro_batches_per_epoch=2",
    "--set", "schedule.warmup_updates=0", "--set", "data.batch_size=4",
    "--set", "distribution.jit_compile=off",
]
TINY = [
    "--set", "model.kwargs.hidden_dim=16", "--set", "model.kwargs.num_layers=1",
    "--set", "model.kwargs.num_heads=2", "--set", "model.kwargs.mlp_dim=32", *SHORT,
]


def _png(path, rgb, size=(20, 24)):
    # Seeded by the split/class/file part of the path: the same pixels in every process.
    rng = np.random.default_rng(zlib.crc32("/".join(path.parts[-3:]).encode()))
    pixels = np.clip(np.array(rgb) + rng.normal(0, 10, (*size, 3)), 0, 255).astype("uint8")
    path.parent.mkdir(parents=True, exist_ok=True)
    tf.io.write_file(str(path), tf.io.encode_png(pixels))
    return str(path)


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    """The demo recipe (a 1-channel model) trained on a folder of RGB images of three
    named classes, as a user runs it: `python -m keras_vit`, output to a pipe."""
    root = tmp_path_factory.mktemp("folder_run")
    for split in ("train", "test"):
        for name, rgb in COLOURS.items():
            for i in range(4):
                _png(root / "data" / split / name / f"{i}.png", rgb)
    out = root / "run"
    result = subprocess.run(
        [sys.executable, "-m", "keras_vit", "pretrain", "--recipe", "demo", "--data",
         str(root / "data"), "--out", str(out), *TINY],
        capture_output=True, text=True, cwd=root, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    return root, out, result


def test_a_folder_run_keeps_its_class_names_and_predict_prints_them(folder_run, capsys):
    root, out, _ = folder_run
    assert (out / runs.LABELS).read_text().splitlines() == sorted(COLOURS)
    image = str(root / "data" / "test" / "dog" / "0.png")
    assert cli.main(["predict", "--from", str(out), image, "--top-k", "3"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == image
    assert sorted(line.split()[-1] for line in printed[1:]) == sorted(COLOURS)
    # The same names are served by its export.
    assert cli.main(["export", "--from", str(out), "--out", str(root / "export")]) == 0
    served = tf.saved_model.load(str(root / "export"))
    labels = served.signatures["serving_default"](images=tf.zeros((1, 20, 24, 1), tf.uint8))
    assert sorted(x.decode() for x in labels["top_k_labels"].numpy()[0]) == sorted(COLOURS)


def test_a_run_written_to_a_pipe_logs_lines_not_escapes_and_names_the_channel_change(folder_run):
    _, out, result = folder_run
    printed = result.stdout + result.stderr
    assert "\x1b" not in printed and "\x08" not in printed and "\r" not in printed
    assert "Epoch 2/2" in result.stdout
    assert (
        "have 3 channels and the model takes 1: they are converted to greyscale as they are read"
        in result.stderr
    )
    assert not (out / runs.BACKUP).exists()  # a finished run keeps no backup folder


def test_every_command_takes_a_run_folder(folder_run, capsys):
    root, out, _ = folder_run
    image = str(root / "data" / "test" / "cat" / "1.png")
    commands = {
        "fewshot": ["--data", str(root / "data"), "--shots", "1", "--seeds", "1",
                    "--out", str(root / "fewshot")],
        "visualize": ["--image", image, "--out", str(root / "figures")],
        "probe": ["--data", str(root / "data"), "--drop", "0,0.5", "--grids", "2",
                  "--out", str(root / "probes")],
    }
    for command, arguments in commands.items():
        assert cli.main([command, "--from", str(out), *arguments]) == 0, capsys.readouterr().err
    # The recipe's architecture (width 64, 2 blocks) gives way to the run's (16, 1 block),
    # as fine-tuning from a checkpoint does in timm and HF.
    assert cli.main(["finetune", "--recipe", "demo", "--from", str(out), "--data",
                     str(root / "data"), "--out", str(root / "tuned"),
                     "--set", "model.image_size=32", *SHORT]) == 0
    log = capsys.readouterr().err
    assert "resampled from a 4x4 to a 8x8" in log
    assert f"Architecture of {out}: custom (patch_size=4, hidden_dim=16, num_layers=1" in log
    tuned = json.loads((root / "tuned" / runs.CONFIG).read_text())["model"]
    trained = json.loads((out / runs.CONFIG).read_text())["model"]
    assert tuned["kwargs"] == trained["kwargs"] and tuned["image_size"] == 32
    assert json.loads((root / "fewshot" / runs.FEWSHOT_RESULTS).read_text())["runs"]["run"]["shots"] == [1]


def test_results_folders_say_what_to_pass_instead(folder_run, tmp_path, capsys):
    root, out, _ = folder_run
    demo = tmp_path / "demo"
    for stage in runs.DEMO_STAGES:  # what `keras-vit demo` writes: a run per stage
        (demo / stage).mkdir(parents=True)
        (demo / stage / runs.CONFIG).write_text((out / runs.CONFIG).read_text())
    fewshot = tmp_path / "fewshot"
    fewshot.mkdir()
    (fewshot / runs.FEWSHOT_RESULTS).write_text("{}")
    image = str(root / "data" / "test" / "cat" / "0.png")
    for folder, expected in (
        (demo, f"is a keras-vit demo folder: its models are in sub-folders; pass {demo}/finetune "
               f"(the fine-tuned model) or {demo}/pretrain (the pretrained one)."),
        (fewshot, "holds few-shot results (fewshot.json), not a model; pass the run folder"),
    ):
        for argv in (["predict", image], ["export", "--out", str(tmp_path / "x")],
                     ["fewshot", "--out", str(tmp_path / "f")], ["visualize", "--image", image,
                     "--out", str(tmp_path / "v")], ["probe", "--out", str(tmp_path / "p")],
                     ["finetune", "--recipe", "demo"]):
            assert cli.main([argv[0], "--from", str(folder), *argv[1:]]) == 2
            errors = capsys.readouterr().err.strip().splitlines()
            assert len(errors) == 1 and expected in errors[0], (argv, errors)


def test_fewshot_keeps_earlier_results_unless_told_to_overwrite(folder_run, tmp_path, capsys):
    root, out, _ = folder_run
    argv = ["fewshot", "--from", str(out), "--data", str(root / "data"), "--shots", "1",
            "--seeds", "1", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    before = (tmp_path / runs.FEWSHOT_RESULTS).read_text()
    capsys.readouterr()
    assert cli.main(argv) == 2
    assert f"{tmp_path} already holds few-shot results" in capsys.readouterr().err
    assert (tmp_path / runs.FEWSHOT_RESULTS).read_text() == before
    assert cli.main([*argv, "--overwrite"]) == 0


def test_loading_another_architecture_logs_the_runs_file_not_a_temporary_one(folder_run, caplog):
    _, out, _ = folder_run
    config = json.loads((out / runs.CONFIG).read_text())["model"]["kwargs"]
    larger = keras_vit.ViT(image_size=32, channels=1, num_classes=3, **config)
    with caplog.at_level("INFO", logger="keras_vit"):
        message = runs.load_weights(larger, str(out))
    assert "resampled from a 4x4 to a 8x8" in message
    assert f"{out / runs.MODEL}: position embedding resampled" in caplog.text
    assert "keras_vit_from" not in caplog.text


def test_predict_classifies_folders_and_patterns_in_batches_as_one_at_a_time(folder_run, tmp_path, capsys):
    root, out, _ = folder_run
    model = runs.load_model(str(out))
    images = sorted(str(p) for p in (root / "data").rglob("*.png"))
    single = [keras_vit.classify(model, path, top_k=2)[0] for path in images]
    batched = keras_vit.classify(model, str(root / "data"), top_k=2, batch_size=5)
    assert [r["image"] for r in batched] == images
    for one, many in zip(single, batched):
        assert [t["class"] for t in one["top_k"]] == [t["class"] for t in many["top_k"]]
        np.testing.assert_allclose([t["probability"] for t in one["top_k"]],
                                   [t["probability"] for t in many["top_k"]], rtol=1e-5)

    # A damaged file among them is skipped and named; the rest are classified (CSV).
    bad = root / "data" / "test" / "cat" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    try:
        assert cli.main(["predict", "--from", str(out), str(root / "data" / "*" / "*" / "*.png"),
                         "--csv", "--top-k", "1", "--batch-size", "4"]) == 0
    finally:
        bad.unlink()
    captured = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(captured.out)))
    assert [row["image"] for row in rows] == images
    # The CLI classifies as the run evaluated: its crop and its loss's activation (CSV:
    # probabilities to 6 decimals).
    config = runs.run_config(str(out))
    expected = keras_vit.classify(
        model, images, top_k=1, labels=sorted(COLOURS),
        crop_fraction=runs.eval_crop_fraction(config, model),
        activation=runs.output_activation(config))
    assert [row["label"] for row in rows] == [r["top_k"][0]["label"] for r in expected]
    np.testing.assert_allclose([float(row["probability"]) for row in rows],
                               [r["top_k"][0]["probability"] for r in expected], atol=1e-6)
    assert f"Skipped an unreadable file: {str(bad)!r}" in captured.err

    assert cli.main(["predict", "--from", str(out), str(tmp_path / "*.jpg")]) == 2
    assert f"No file matches {str(tmp_path / '*.jpg')!r}." in capsys.readouterr().err
