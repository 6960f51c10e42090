"""The `keras-vit` command: recipes, --set parsing, --from resolution, the demo end to end."""

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from helpers import tiny_demo_recipe, tiny_vit

from keras_vit import cli
from keras_vit.training import runs
from keras_vit.training.config import FLAT_KEYS, TrainConfig, apply_overrides

FIXTURE_RUN = Path(__file__).resolve().parent / "fixtures" / "run_v0_1_0"
ROOT = Path(__file__).resolve().parents[1]

# `python -m keras_vit ARGS`, then which heavy modules the process imported.
CLI = """
import atexit, runpy, sys
heavy = ("tensorflow", "keras", "jax", "torch")
atexit.register(lambda: print("imported:", [m for m in heavy if m in sys.modules]))
runpy.run_module("keras_vit", run_name="__main__")
"""


def _fresh_process(*args, code=CLI):
    """A fresh Python whose user did not set TF_CPP_MIN_LOG_LEVEL."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize(
    "args, code",
    [(["--help"], 0), (["pretrain", "--help"], 0), (["probe", "--bogus"], 2),
     (["export", "--from", "run"], 2), ([], 2)],
)
def test_help_and_argument_errors_come_before_tensorflow_starts(args, code):
    process = _fresh_process(*args)
    assert process.returncode == code, process.stderr
    assert "usage: keras-vit" in process.stdout + process.stderr
    assert process.stdout.splitlines()[-1] == "imported: []"


# TensorFlow's C++ start-up lines: absl/glog records (severity and date) and their notes.
CPP_LOG_LINE = re.compile(r"^[IWEF]\d{4} |absl::InitializeLog|oneDNN|cpu_feature_guard")


@pytest.mark.slow
def test_a_command_prints_none_of_tensorflows_start_up_lines(tmp_path):
    # Started plainly, TensorFlow prints them here even at TF_CPP_MIN_LOG_LEVEL=3 ...
    plain = _fresh_process(code="import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
                                "import tensorflow")
    assert plain.returncode == 0 and any(map(CPP_LOG_LINE.search, plain.stderr.splitlines()))
    # ... a command of the CLI prints only its own lines.
    process = _fresh_process("probe", "--from", str(FIXTURE_RUN), "--out", str(tmp_path),
                             "--drop", "0", "--grids", "2")
    assert process.returncode == 0, process.stderr
    assert "'tensorflow'" in process.stdout.splitlines()[-1]  # it did start TensorFlow
    assert "clean accuracy" in process.stdout
    assert [line for line in process.stderr.splitlines() if not line.startswith("keras-vit: ")] == []


def test_set_parses_values_by_field_type():
    recipe = TrainConfig()
    config = apply_overrides(
        recipe,
        [
            "schedule.epochs=7", "schedule.learning_rate=3e-4", "data.cache=true",
            "data.random_flip=off", "data.crop_area=(0.5, 1.0)", "data.randaugment=(2, 15)",
            "optimization.clip_norm=none", "data.mixup=0.2", "model.variant=S/16",
            "model.kwargs.dropout_rate=0.1", "model.kwargs.classifier=gap", "seed=3",
            "model.kwargs.remat=true", "model.kwargs.representation_size=None",
        ],
    )
    assert (config.schedule.epochs, config.schedule.learning_rate) == (7, 3e-4)
    assert (config.data.cache, config.data.random_flip) == (True, False)
    assert config.data.crop_area == (0.5, 1.0) and config.data.randaugment == (2, 15)
    assert config.optimization.clip_norm is None and config.data.mixup == 0.2
    assert config.model.variant == "S/16" and config.seed == 3
    assert config.model.kwargs == {"dropout_rate": 0.1, "classifier": "gap", "remat": True,
                                   "representation_size": None}
    # The recipe's object is left as it was.
    assert recipe == TrainConfig() and recipe.model.kwargs == {}


def test_flat_keys_of_version_0_1_are_moved_to_their_sections(caplog):
    flat = [
        "epochs=7", "learning_rate=3e-4", "model=S/16", "model_kwargs.num_layers=3",
        "data=tfds:cifar10", "schedule=cosine", "steps=100", "warmup_steps=10",
        "steps_per_epoch=20", "backup_every=4", "steps_per_execution=2",
        "accumulation_steps=2", "eval_crop_fraction=1.0", "strict_data=true",
    ]
    sectioned = [
        "schedule.epochs=7", "schedule.learning_rate=3e-4", "model.variant=S/16",
        "model.kwargs.num_layers=3", "data.source=tfds:cifar10", "schedule.decay=cosine",
        "schedule.updates=100", "schedule.warmup_updates=10",
        "schedule.micro_batches_per_epoch=20", "checkpointing.backup_every_micro_batches=4",
        "distribution.micro_batches_per_execution=2", "optimization.micro_batches_per_update=2",
        "evaluation.crop_fraction=1.0", "data.strict=true",
    ]
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        old = apply_overrides(TrainConfig(), flat)
    assert old == apply_overrides(TrainConfig(), sectioned)
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == len(flat)
    assert "--set learning_rate=3e-4: flat key 'learning_rate' is deprecated, use " \
        "'schedule.learning_rate'." in notes
    # The Python API maps them too: 0.1's keyword arguments and dataclasses.replace.
    assert TrainConfig(learning_rate=3e-4, model="S/16").schedule.learning_rate == 3e-4
    assert dataclasses.replace(TrainConfig(), epochs=4).schedule.epochs == 4


def test_a_version_0_1_recipe_gives_the_same_config(caplog):
    """A recipe written for keras-vit 0.1: flat TrainConfig(...) keywords and
    dataclasses.replace(config, epochs=...)."""
    old = str(FIXTURE_RUN.parent / "recipe_v0_1_0_demo.py")
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        # The demo recipe's own run moved from runs/demo (the demo command's folder) to
        # runs/digits; the demo's stages run in sub-folders of its out whatever theirs say.
        assert cli.load_recipe(old) == cli.load_recipe("demo").replace(out="runs/demo")
        demo = cli.load_recipe("demo", attribute="DEMO")
        assert cli.load_recipe(old, attribute="DEMO") == dataclasses.replace(
            demo, pretrain=demo.pretrain.replace(out="runs/demo"),
            finetune=demo.finetune.replace(out="runs/demo"),
        )
    assert "flat config keys of keras-vit 0.1 moved to their sections" in caplog.text


def test_every_flat_key_of_a_version_0_1_run_has_a_section():
    saved = json.loads((FIXTURE_RUN / runs.CONFIG).read_text())
    assert sorted(saved) == sorted(FLAT_KEYS)
    config = TrainConfig.from_dict(saved)
    for old, new in FLAT_KEYS.items():
        value = dict(config.flat_items())[new]
        assert value == (tuple(saved[old]) if isinstance(value, tuple) else saved[old]), old
    # ... and the sectioned form is an exact round trip through JSON.
    assert TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("epochz=3", "Unknown config key 'epochz'.*valid keys: .*schedule"),
        ("schedule.epochz=3", "Unknown config key 'schedule.epochz'.*valid keys: .*schedule.epochs"),
        ("schedule.epochs=three", "schedule.epochs expects an integer, got 'three'"),
        ("epochs=2.5", "schedule.epochs expects an integer, got '2.5'"),
        ("data.cache=maybe", "data.cache expects true or false, got 'maybe'"),
        ("data.crop_area=[0.5", "data.crop_area expects a Python tuple literal"),
        ("learning_rate", "expects key=value, got 'learning_rate'"),
        ("schedule.epochs.x=1", "schedule.epochs is not a dict field"),
        ("optimization=sgd", "optimization is a section; set one of its keys"),
    ],
)
def test_set_errors_name_the_bad_assignment(assignment, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(TrainConfig(), [assignment])


def test_command_reports_errors_without_a_traceback(capsys):
    assert cli.main(["pretrain", "--recipe", "demo", "--set", "epochz=3"]) == 2
    error = capsys.readouterr().err
    assert "Unknown config key 'epochz'" in error and "Traceback" not in error
    assert cli.main(["pretrain", "--recipe", "demo", "--set", "optimization.optimizer=lamb"]) == 2
    assert "Unknown optimization.optimizer 'lamb': expected one of 'adam', 'adamw', 'sgd'" in (
        capsys.readouterr().err
    )
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
    for key in ("model.variant", "model.image_size", "data.batch_size", "schedule.epochs",
                "schedule.learning_rate"):
        assert dict(config.flat_items())[key]


def test_fewshot_command_reads_a_version_0_1_run(tmp_path, capsys):
    out = tmp_path / "fewshot"
    assert cli.main(["fewshot", "--from", str(FIXTURE_RUN), "--data", "digits", "--classes", "5-9",
                     "--shots", "1,5", "--seeds", "2", "--out", str(out)]) == 0
    result = json.loads((out / "fewshot.json").read_text())["runs"]["run_v0_1_0"]
    assert result["shots"] == [1, 5] and result["class_names"] == ["5", "6", "7", "8", "9"]
    assert "run_v0_1_0" in capsys.readouterr().out


def test_from_resolves_runs_and_files(tmp_path):
    run = tmp_path / "run"
    (run / runs.CHECKPOINTS).mkdir(parents=True)
    (run / runs.CONFIG).write_text("{}")
    with pytest.raises(FileNotFoundError, match="neither model.keras nor a checkpoint"):
        runs.resolve_from(str(run))
    for epoch in (1, 2):
        (run / runs.CHECKPOINTS / f"epoch_{epoch:04d}.keras").write_text("")
    assert runs.resolve_from(str(run)).path == str(run / runs.CHECKPOINTS / "epoch_0002.keras")
    (run / runs.MODEL).write_text("")
    assert runs.resolve_from(str(run)).path == str(run / runs.MODEL)
    with pytest.raises(FileNotFoundError, match="missing.keras"):
        runs.resolve_from(str(tmp_path / "missing.keras"))
    assert runs.resolve_from("gs://vit_models/imagenet21k/ViT-B_16.npz").path.endswith("B_16.npz")


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
    assert TrainConfig.from_dict(json.loads((out / runs.CONFIG).read_text())) == (
        cli.load_recipe("demo").replace(out=str(out))
    )
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

    config = apply_overrides(cli.load_recipe("demo"), ["model.image_size=32"])
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
    recipe = tiny_demo_recipe(tmp_path)
    out = tmp_path / "demo"
    with caplog.at_level("INFO", logger="keras_vit"):
        assert cli.main(["demo", "--recipe", str(recipe), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for stage in ("Stage 1/3", "Stage 2/3", "Stage 3/3", "head is reset to zeros",
                  "position embedding resampled"):
        assert stage in caplog.text

    # The sample digit the docs' visualize and predict examples read.
    from keras_vit.demo import write_sample_digit

    write_sample_digit(str(tmp_path / "digit.png"))
    assert (out / "digit.png").read_bytes() == (tmp_path / "digit.png").read_bytes()

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
    # A ViT with random weights, not a copy whose zero head gives constant "features":
    # 5-shot digits 5-9 well above the 20% of chance (about 40% in the full demo).
    assert results["random init"]["mean"][1] > 0.3
    assert rows[1][1:] == [
        f"{100 * results[name]['mean'][0]:.1f} ± {100 * results[name]['std'][0]:.1f}%"
        for name in ("pretrained", "random init")
    ]
    assert results["pretrained"]["class_names"] == ["5", "6", "7", "8", "9"]
    assert rows[3] == [f"pretrain (classes 0-4, {demo.pretrain.model.image_size} px)",
                       f"{100 * final['pretrain']:.1f}%", "-"]
    assert rows[4] == [f"fine-tune (classes 5-9, {demo.finetune.model.image_size} px)",
                       f"{100 * final['finetune']:.1f}%", "-"]
    assert (out / "table.txt").read_text() == summary["table"] + "\n"
    assert summary["table"] in printed
    for png in ("fewshot.png", "training.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Fine-tuning started from the pretrained encoder: a new resolution, a zero head.
    assert json.loads((out / "finetune" / runs.CONFIG).read_text())["model"]["init_from"].endswith(
        "pretrain/encoder.npz"
    )
    assert not [k for k in np.load(out / "pretrain" / "encoder.npz") if k.startswith("head")]
    pretrained, finetuned = (runs.load_model(str(out / stage)) for stage in ("pretrain", "finetune"))
    assert finetuned.input_shape[1] == demo.finetune.model.image_size != pretrained.input_shape[1]
    assert finetuned.output_shape == pretrained.output_shape == (None, 5)


# --- bad input and failures: one line each, exit code 2 (1 once training is under way) ---

TINY = [
    "--set", "model.kwargs.hidden_dim=16", "--set", "model.kwargs.num_layers=1",
    "--set", "model.kwargs.num_heads=2", "--set", "model.kwargs.mlp_dim=32",
    "--set", "schedule.epochs=2", "--set", "schedule.micro_batches_per_epoch=2",
    "--set", "evaluation.enabled=false", "--set", "distribution.jit_compile=off",
]


def _one_line_error(capsys, code, expected, argv):
    assert cli.main(argv) == code
    stderr = capsys.readouterr().err
    error = [line for line in stderr.splitlines() if ": error: " in line]
    assert len(error) == 1 and "Traceback" not in stderr, stderr
    assert expected in error[0], error[0]
    return error[0]


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("model.kwargs.num_layers=abc", "num_layers must be a positive integer, got 'abc'."),
        ("model.kwargs.num_layer=2", "ViT takes no argument 'num_layer'; its arguments: image_size"),
        ("model.kwargs.dropout_rate=1.5", "dropout_rate must be in [0, 1), got 1.5."),
        ("model.kwargs.image_size=32", "model.kwargs.image_size is set by the run: set model.image_size"),
    ],
)
def test_bad_model_kwargs_are_one_line(capsys, assignment, message):
    _one_line_error(capsys, 2, message, ["pretrain", "--recipe", "demo", "--set", assignment])


def test_unusable_out_folders_are_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    line = _one_line_error(
        capsys, 2, "is not a directory (check the path: a folder written to must be writable",
        ["pretrain", "--recipe", "demo", "--out", str(tmp_path / "file" / "run"), *TINY],
    )
    assert str(tmp_path / "file") in line
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "locked").mkdir(mode=0o555)
        _one_line_error(
            capsys, 2, "Permission denied",
            ["pretrain", "--recipe", "demo", "--out", str(tmp_path / "locked" / "run"), *TINY],
        )


def test_a_failure_during_training_is_one_line_with_exit_code_1(tmp_path, capsys):
    # The checkpoints folder of a run (its config.json written) cannot be made (a file
    # holds its name): the first epoch's checkpoint write fails once training is under way.
    out = tmp_path / "run"
    out.mkdir()
    (out / runs.CONFIG).write_text(json.dumps(TrainConfig().to_dict()))
    (out / runs.CHECKPOINTS).write_text("")
    line = _one_line_error(
        capsys, 1, "Training stopped:", ["pretrain", "--recipe", "demo", "--out", str(out), *TINY]
    )
    assert "the same command resumes the run from its backup (epoch 1, micro-batch 0)" in line


def test_missing_weights_are_one_line_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "run"
    _one_line_error(
        capsys, 2, f"--from {str(tmp_path / 'nowhere.npz')!r} does not exist: pass a run's",
        ["finetune", "--recipe", "demo", "--from", str(tmp_path / "nowhere.npz"), "--out", str(out)],
    )
    assert not out.exists()


def test_truncated_keras_file_is_reported_as_such(tmp_path, capsys):
    tiny_vit().save(tmp_path / "model.keras")
    data = (tmp_path / "model.keras").read_bytes()
    (tmp_path / "model.keras").write_bytes(data[: len(data) // 2])
    line = _one_line_error(
        capsys, 2, "is not a complete .keras file",
        ["export", "--from", str(tmp_path / "model.keras"), "--out", str(tmp_path / "served")],
    )
    assert "truncated or corrupt" in line and "File not found" not in line


def test_debug_variable_shows_the_traceback(monkeypatch):
    monkeypatch.setenv("KERAS_VIT_DEBUG", "1")
    with pytest.raises(ValueError, match="Unknown config key 'schedule.epochz'"):
        cli.main(["pretrain", "--recipe", "demo", "--set", "schedule.epochz=3"])


def test_a_held_run_folder_is_refused_naming_its_holder(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    with runs.hold(str(out)):
        _one_line_error(
            capsys, 2, f"is in use by another run (pid {os.getpid()} on ",
            ["pretrain", "--recipe", "demo", "--out", str(out), *TINY],
        )
    assert not list(out.glob("*.json"))  # the refused run wrote nothing


def test_short_run_shortens_warmup_finished_run_is_kept_and_restart_starts_over(
    tmp_path, capsys, caplog
):
    # The demo recipe warms up over 40 updates; this run makes 4.
    out = tmp_path / "run"
    argv = ["pretrain", "--recipe", "demo", "--out", str(out), *TINY]
    with caplog.at_level("INFO", logger="keras_vit"):
        assert cli.main(argv) == 0
    assert ("schedule.warmup_updates 40 does not fit the run's 4 optimizer updates: warming up "
            "over 2") in caplog.text
    assert json.loads((out / runs.METRICS_JSON).read_text())["warmup_updates"] == 2
    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != runs.LOCK}
    weights = runs.load_model(str(out)).get_weights()
    caplog.clear()
    with caplog.at_level("INFO", logger="keras_vit"):
        assert cli.main(argv) == 0  # finished: nothing retrained, nothing rewritten
    assert "holds this finished run: nothing to do" in caplog.text
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != runs.LOCK} == files
    # Another config is not taken for this run.
    _one_line_error(capsys, 2, "holds a finished run whose config differs in ['schedule.learning_rate']",
                    [*argv, "--set", "schedule.learning_rate=0.1"])
    (out / runs.CHECKPOINTS / "epoch_0001.keras").unlink()
    assert cli.main([*argv, "--restart"]) == 0
    assert (out / runs.CHECKPOINTS / "epoch_0001.keras").exists()  # trained again
    for a, b in zip(weights, runs.load_model(str(out)).get_weights()):
        np.testing.assert_array_equal(a, b)


def test_the_command_logs_its_lines_whatever_a_caller_did_to_the_logger_first(capsys, caplog):
    """A first command run under `caplog.at_level` (or a notebook's logging setup that is later
    undone) must not leave the next commands silent."""
    logger = logging.getLogger("keras_vit")
    handlers, level = logger.handlers[:], logger.level
    logger.handlers.clear()
    logger.setLevel(logging.NOTSET)
    note = lambda args: logging.getLogger("keras_vit.x").info("a note") or 0  # noqa: E731
    cli.COMMANDS["note-a-line"] = ("", None, note)
    try:
        with caplog.at_level("INFO", logger="keras_vit"):
            assert cli.main(["note-a-line"]) == 0
        capsys.readouterr()
        assert cli.main(["note-a-line"]) == 0
        assert capsys.readouterr().err == "keras-vit: a note\n"
    finally:
        del cli.COMMANDS["note-a-line"]
        logger.handlers[:] = handlers
        logger.setLevel(level)
