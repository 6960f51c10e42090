"""User mistakes of issue 48 (items 9 and 15), as a user meets them: each is one line
saying what is wrong and what to do, and files written for spreadsheets run no formula."""

import csv
import io
import re
import socket
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import keras_vit
from keras_vit import cli
from helpers import bucket_entry, bucket_model, tiny_vit

FINETUNE_TINY = [
    "--data", "digits", "--set", "model.variant=custom", "--set", "model.image_size=32",
    "--set", "model.kwargs.patch_size=8", "--set", "model.kwargs.hidden_dim=32",
    "--set", "model.kwargs.num_layers=2", "--set", "model.kwargs.num_heads=4",
    "--set", "model.kwargs.mlp_dim=64", "--set", "data.batch_size=16",
    "--set", "schedule.updates=1", "--set", "schedule.warmup_updates=0",
    "--set", "checkpointing.tensorboard=false",
]


def png(path, colour=(200, 30, 30)):
    import tensorflow as tf

    pixels = tf.constant(np.full((32, 32, 3), colour, np.uint8))
    tf.io.write_file(str(path), tf.io.encode_png(pixels))
    return str(path)


# --- 15: two JAX processes with the same id ------------------------------------------


def test_two_processes_with_the_same_id_are_told_the_ids_must_differ():
    jax_processes = pytest.importorskip("keras_vit.training.jax_processes")
    with socket.socket() as s:  # the handshake listens on the coordinator's port + 1
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1] - 1
    coordinator = f"127.0.0.1:{port}"

    def start(delay):
        import time

        time.sleep(delay)
        with pytest.raises(jax_processes.JoinError) as raised:
            jax_processes.handshake(coordinator, 2, 0, timeout=3)
        return str(raised.value)

    with ThreadPoolExecutor(2) as pool:  # both started with distribution.process_id=0
        first, second = pool.submit(start, 0), pool.submit(start, 0.5)
        messages = [first.result(), second.result()]
    for message in messages:
        assert message == (
            "The run's processes did not start together: two processes have process_id 0 "
            "(each needs its own process_id); process 1 of 2 did not join within 3 s. Start "
            "one process per id 0..num_processes-1, all with the same coordinator and "
            "num_processes (distribution.join_timeout waits longer)."
        )


def test_a_port_taken_by_another_program_still_says_pick_another_port():
    jax_processes = pytest.importorskip("keras_vit.training.jax_processes")
    with socket.socket() as other:  # not a keras-vit process: it never answers
        other.bind(("", 0))
        other.listen(1)
        port = other.getsockname()[1] - 1
        with pytest.raises(jax_processes.JoinError, match="pick another coordinator port"):
            jax_processes.handshake(f"127.0.0.1:{port}", 2, 0, timeout=1)


# --- 15: a binary labels file ----------------------------------------------------------


def test_a_binary_labels_file_is_named(tmp_path, capsys):
    model = str(tmp_path / "model.keras")
    tiny_vit().save(model)
    image = png(tmp_path / "red.png")
    # The mistake: an image passed as --labels.
    assert cli.main(["predict", "--from", model, "--labels", image, image]) == 2
    assert capsys.readouterr().err == (
        f"keras-vit predict: error: Labels file {image!r} is not a text file (byte 0 is not "
        "UTF-8); pass class names, one per line in class order, as UTF-8 text.\n"
    )


# --- 15: NaN weights on the command line ----------------------------------------------


def test_nan_weights_on_the_command_line_say_no_strict_false(tmp_path, capsys):
    diverged = tiny_vit()
    query = diverged.parts.blocks[0].qkv.kernel
    query.assign(np.full(query.shape, np.nan, "float32"))
    path = str(tmp_path / "diverged.npz")
    keras_vit.save_npz(diverged, path)
    code = cli.main(["finetune", "--from", path, "--out", str(tmp_path / "run"), *FINETUNE_TINY])
    err = capsys.readouterr().err.splitlines()[-1]  # after the run's notes
    assert code == 2, err
    assert err.startswith(f"keras-vit finetune: error: Checkpoint {path} holds NaN or infinite values")
    assert err.endswith(": a run cannot start from it (a diverged run saves such weights); pick "
                        "an earlier checkpoint.")
    assert "strict=False" not in err


def test_nan_registry_weights_in_predict_say_no_strict_false(bucket, tmp_path, capsys):
    model = bucket_model()
    head = model.parts.head.bias
    head.assign(np.full(head.shape, np.nan, "float32"))
    bucket.put("test/diverged.npz", model)
    entry = bucket_entry("test_diverged", "test/diverged.npz")
    image = png(tmp_path / "red.png")
    assert cli.main(["predict", "--weights", entry.name, image]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the download's lines
    assert err.startswith("keras-vit predict: error: Checkpoint ")
    assert err.endswith(": the model would not give finite outputs, and keras-vit predict "
                        "does not load it; delete the file to download it again.")
    assert "strict=False" not in err


# --- 15: CSV cells that a spreadsheet would run ----------------------------------------


def test_predict_csv_neutralises_formula_cells(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # images named as a user names those beside them
    model = str(tmp_path / "model.keras")
    tiny_vit(num_classes=2).save(model)
    png(tmp_path / "=HYPERLINK(1).png")
    png(tmp_path / "-2+3.png", (0, 0, 255))
    (tmp_path / "labels.txt").write_text("@SUM(1+1)\n+cmd|' /C calc'!A0\n")
    assert cli.main(["predict", "--from", model, "--labels", "labels.txt", "--csv",
                     "--top-k", "2", "--", "=HYPERLINK(1).png", "-2+3.png"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["image", "rank", "class", "label", "probability"]
    assert [row[0] for row in rows[1:]] == ["'=HYPERLINK(1).png"] * 2 + ["'-2+3.png"] * 2
    assert {row[2]: row[3] for row in rows[1:]} == {"0": "'@SUM(1+1)", "1": "'+cmd|' /C calc'!A0"}
    assert sorted(row[1] for row in rows[1:]) == ["1", "1", "2", "2"]
    assert all(0 <= float(row[4]) <= 1 for row in rows[1:])


# --- 9: a model that cannot fit the machine's memory ------------------------------------


def test_a_run_whose_model_cannot_fit_is_refused_with_the_estimate(tmp_path, capsys):
    out = tmp_path / "run"
    code = cli.main(["pretrain", "--recipe", "demo", "--out", str(out),
                     "--set", "model.kwargs.num_layers=100000000"])
    err = capsys.readouterr().err
    assert code == 2, err
    line = err.splitlines()[-1]
    # The demo's model: width 64, MLP 128, 4x4 patches of 16x16 grey images (17 tokens):
    # per block 4 width^2 + 2 width mlp + 9 width + mlp; the patch projection (16 + 1) x
    # width, 17 positions and the class token, the final norm 2 x width (no head: the
    # data decides its classes).
    parameters = 100_000_000 * (4 * 64 * 64 + 2 * 64 * 128 + 9 * 64 + 128) + 17 * 64 + 18 * 64 + 2 * 64
    assert line.startswith(f"keras-vit pretrain: error: Training this model ({parameters:,} "
                           "parameters; "), line
    assert " GB available: make the model smaller (model.kwargs.num_layers" in line
    assert not out.exists()  # refused before anything was written or built


def test_a_naflex_run_is_estimated_at_its_rows_tokens(tmp_path, capsys):
    """Packed NaFlex rows of 20,000 tokens: the activations of rows of that many patch
    tokens and one prefix token per image, not of the model's 17-token images, are what
    cannot fit."""
    from keras_vit.models.size import GB, activation_values

    out = tmp_path / "run"
    code = cli.main(["pretrain", "--recipe", "demo", "--out", str(out), "--set",
                     "data.naflex=true", "--set", "data.images_per_row=4", "--set",
                     "data.row_tokens=20000", "--set", "distribution.precision=float32"])
    line = capsys.readouterr().err.splitlines()[-1]
    assert code == 2, line
    batch = int(re.search(r"for a micro-batch of (\d+) images", line).group(1))
    # The demo's model: width 64, MLP 128, 4 heads, 2 blocks; float32.
    values = activation_values(tokens=20000 + 4, hidden_dim=64, mlp_dim=128, num_heads=4,
                               num_layers=2)
    assert f"{batch * values * 4 / GB:,.1f} GB for a micro-batch of {batch} images'" in line
    assert not out.exists()


def test_the_estimate_counts_the_parameters_keras_counts():
    from keras_vit.models.size import parameter_count

    for overrides in ({}, dict(num_classes=0, include_top=False), dict(image_size=48, channels=1)):
        model = tiny_vit(**overrides)
        height = model.input_shape[1]
        assert parameter_count(
            tokens=(height // 8) ** 2 + 1, patch_values=8 * 8 * model.input_shape[-1],
            hidden_dim=32, mlp_dim=64, num_layers=2,
            num_classes=model.output_shape[-1] if overrides.get("include_top", True) else 0,
        ) == model.count_params(), overrides


def test_a_vit_that_cannot_fit_is_refused_before_it_is_built():
    # Per block 4 x 32^2 + 2 x 32 x 64 + 9 x 32 + 64 = 8544; embedding (8 x 8 x 3 + 1) x 32 +
    # (16 + 1 + 1) x 32, final norm 64, head 33 x 10.
    with pytest.raises(ValueError, match=r"^This ViT \(854,400,007,146 parameters\) needs at "
                                         r"least 3,417\.6 GB, and this machine has [\d,.]+ GB "
                                         r"available: make it smaller \(num_layers"):
        tiny_vit(num_layers=100_000_000)
