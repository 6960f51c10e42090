"""The `keras-vit` command: recipes, --set parsing, --from resolution, the demo end to end."""

import json

import keras
import numpy as np
import pytest
from conftest import tiny_vit

from keras_vit import cli
from keras_vit.training import runs
from keras_vit.training.engine import TrainConfig


def test_set_parses_values_by_field_type():
    config = cli.apply_overrides(
        TrainConfig(),
        [
            "epochs=7", "learning_rate=3e-4", "cache=true", "random_flip=off",
            "crop_area=(0.5, 1.0)", "randaugment=(2, 15)", "clip_norm=none", "mixup=0.2",
            "model=S/16", "model_kwargs.dropout_rate=0.1", "model_kwargs.classifier=gap",
        ],
    )
    assert (config.epochs, config.learning_rate, config.cache, config.random_flip) == (
        7, 3e-4, True, False,
    )
    assert config.crop_area == (0.5, 1.0) and config.randaugment == (2, 15)
    assert config.clip_norm is None and config.mixup == 0.2 and config.model == "S/16"
    assert config.model_kwargs == {"dropout_rate": 0.1, "classifier": "gap"}
    # The recipe's object is left as it was.
    assert TrainConfig().epochs == 1


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("epochz=3", "Unknown config key 'epochz'.*valid keys: .*epochs"),
        ("epochs=three", "epochs expects an integer, got 'three'"),
        ("epochs=2.5", "epochs expects an integer, got '2.5'"),
        ("cache=maybe", "cache expects true or false, got 'maybe'"),
        ("crop_area=[0.5", "crop_area expects a Python tuple literal"),
        ("learning_rate", "expects key=value, got 'learning_rate'"),
        ("epochs.x=1", "epochs is not a dict field"),
    ],
)
def test_set_errors_name_the_bad_assignment(assignment, message):
    with pytest.raises(ValueError, match=message):
        cli.apply_overrides(TrainConfig(), [assignment])


def test_command_reports_errors_without_a_traceback(capsys):
    assert cli.main(["pretrain", "--recipe", "demo", "--set", "epochz=3"]) == 2
    error = capsys.readouterr().err
    assert "Unknown config key 'epochz'" in error and "Traceback" not in error
    assert cli.main(["pretrain", "--recipe", "demo", "--set", "optimizer=lamb"]) == 2
    assert "optimizer='lamb' is not one of 'adam', 'adamw', 'sgd'" in capsys.readouterr().err
    assert cli.main(["finetune", "--recipe", "demo"]) == 2
    assert "finetune needs weights: pass --from" in capsys.readouterr().err
    assert cli.main(["pretrain", "--recipe", "nonesuch"]) == 2
    error = capsys.readouterr().err
    assert "No recipe 'nonesuch'" in error and "demo, demo_mpp, fewshot, finetune, pretrain" in error


@pytest.mark.parametrize("name", ["demo", "pretrain", "finetune", "demo_mpp", "pretrain_mpp"])
def test_recipes_are_valid_configs(name):
    config = cli.load_recipe(name)
    assert isinstance(config, TrainConfig)
    config.validate()
    for field in ("model", "image_size", "batch_size", "epochs", "learning_rate"):
        assert getattr(config, field)


def test_from_resolves_runs_and_files(tmp_path):
    run = tmp_path / "run"
    (run / runs.CHECKPOINTS).mkdir(parents=True)
    (run / runs.CONFIG).write_text("{}")
    with pytest.raises(FileNotFoundError, match="neither model.keras nor a checkpoint"):
        runs.resolve_from(str(run))
    for epoch in (1, 2):
        (run / runs.CHECKPOINTS / f"epoch_{epoch:04d}.keras").write_text("")
    assert runs.resolve_from(str(run)) == str(run / runs.CHECKPOINTS / "epoch_0002.keras")
    (run / runs.MODEL).write_text("")
    assert runs.resolve_from(str(run)) == str(run / runs.MODEL)
    with pytest.raises(FileNotFoundError, match="missing.keras"):
        runs.resolve_from(str(tmp_path / "missing.keras"))
    assert runs.resolve_from("gs://vit_models/imagenet21k/ViT-B_16.npz").endswith("B_16.npz")


def test_from_copies_a_same_shaped_model(tmp_path):
    source = tiny_vit()
    for variable in source.weights:
        variable.assign(keras.random.normal(variable.shape, seed=1))
    source.save(tmp_path / "source.keras")
    target = tiny_vit()
    assert runs.load_weights(target, str(tmp_path / "source.keras")).startswith("copied")
    for a, b in zip(source.get_weights(), target.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # trains to an accuracy
def test_demo_recipe_trains_to_95_percent_on_digits(tmp_path, capsys):
    out = tmp_path / "demo"
    assert cli.main(["pretrain", "--recipe", "demo", "--out", str(out)]) == 0
    metrics = json.loads((out / runs.METRICS_JSON).read_text())
    accuracy = metrics["final"]["top1"]
    with capsys.disabled():
        print(f"\ndemo recipe: digits test accuracy {accuracy:.4f} "
              f"({metrics['eval_examples']} images, {metrics['seconds']:.0f} s of training)")
    assert accuracy >= 0.95
    assert json.loads((out / runs.CONFIG).read_text())["model"] == "custom"
    rows = (out / runs.METRICS_CSV).read_text().splitlines()
    assert len(rows) == 1 + metrics["epochs"] and "val_top1" in rows[0]
    assert runs.latest_checkpoint(str(out)) is not None
    assert not (out / runs.BACKUP / "state.npz").exists()
    trained = runs.load_model(str(out))
    assert trained.output_shape == (None, 10)

    # Fine-tuning at 32 px starts from these weights, the 4x4 position grid resampled
    # to 8x8 bilinearly with aligned corners (vit_jax, = scipy's zoom of order 1).
    from scipy.ndimage import zoom

    from keras_vit.training.engine import _build_model

    config = cli.apply_overrides(cli.load_recipe("demo"), ["image_size=32"])
    larger = _build_model(config, num_classes=10)
    assert "resampled from a 4x4 to a 8x8" in runs.load_weights(larger, str(out))
    table = trained.get_layer("patch_encoder").position.numpy().reshape(4, 4, -1)
    np.testing.assert_allclose(
        larger.get_layer("patch_encoder").position.numpy().reshape(8, 8, -1),
        zoom(table, (2, 2, 1), order=1), atol=1e-6,
    )
    for name in ("encoderblock_0", "encoderblock_1", "head"):
        for a, b in zip(trained.get_layer(name).get_weights(), larger.get_layer(name).get_weights()):
            np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # runs the demo's three training stages
def test_demo_command_runs_all_stages_and_reports_them(tmp_path, capsys, caplog):
    """The demo recipe's pipeline, cut to a few steps per stage (same code path)."""
    recipe = tmp_path / "tiny_demo.py"
    recipe.write_text(
        "import dataclasses\n"
        "from keras_vit.cli import load_recipe\n"
        "demo = load_recipe('demo', attribute='DEMO')\n"
        "tiny = dict(epochs=1, steps_per_epoch=2, warmup_steps=0, jit_compile='off')\n"
        "DEMO = dataclasses.replace(\n"
        "    demo, pretrain=dataclasses.replace(demo.pretrain, **tiny),\n"
        "    fewshot=dataclasses.replace(demo.fewshot, shots=(1, 5), seeds=2),\n"
        "    finetune=dataclasses.replace(demo.finetune, **tiny))\n"
    )
    out = tmp_path / "demo"
    with caplog.at_level("INFO", logger="keras_vit"):
        assert cli.main(["demo", "--recipe", str(recipe), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for stage in ("Stage 1/3", "Stage 2/3", "Stage 3/3", "head is reset to zeros",
                  "position embedding resampled"):
        assert stage in caplog.text

    demo = cli.load_recipe("demo", attribute="DEMO")
    summary = json.loads((out / "summary.json").read_text())
    final = {
        stage: json.loads((out / stage / runs.METRICS_JSON).read_text())["final"]["top1"]
        for stage in ("pretrain", "finetune")
    }
    assert (summary["pretrain_accuracy"], summary["finetune_accuracy"]) == (
        final["pretrain"], final["finetune"],
    )
    rows = [[c.strip() for c in line.split("|")] for line in printed.splitlines() if "|" in line]
    assert rows[0] == ["shots", "pretrained", "random init"]
    assert [row[0] for row in rows[1:3]] == ["1", "5"]
    results = summary["fewshot"]
    assert rows[1][1:] == [
        f"{100 * results[name]['mean'][0]:.1f} ± {100 * results[name]['std'][0]:.1f}%"
        for name in ("pretrained", "random init")
    ]
    assert results["pretrained"]["class_names"] == ["5", "6", "7", "8", "9"]
    assert rows[3] == [f"pretrain (classes 0-4, {demo.pretrain.image_size} px)",
                       f"{100 * final['pretrain']:.1f}%", "-"]
    assert rows[4] == [f"fine-tune (classes 5-9, {demo.finetune.image_size} px)",
                       f"{100 * final['finetune']:.1f}%", "-"]
    assert (out / "table.txt").read_text() == summary["table"] + "\n"
    assert summary["table"] in printed
    for png in ("fewshot.png", "training.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Fine-tuning started from the pretrained encoder: a new resolution, a zero head.
    assert json.loads((out / "finetune" / runs.CONFIG).read_text())["init_from"].endswith(
        "pretrain/encoder.npz"
    )
    assert not [k for k in np.load(out / "pretrain" / "encoder.npz") if k.startswith("head")]
    pretrained, finetuned = (runs.load_model(str(out / stage)) for stage in ("pretrain", "finetune"))
    assert finetuned.input_shape[1] == demo.finetune.image_size != pretrained.input_shape[1]
    assert finetuned.output_shape == pretrained.output_shape == (None, 5)
