"""Every `--from` and `keras_vit.pretrained` source as a user meets it (issue 48, items 4,
6, 10, 11 and 12): weights that cannot serve (NaN, integers) are refused on every path
that loads them; an HF folder whose config.json disagrees with its tensors, or is not
JSON, or names another model type, is refused naming the file and both sides; a
damaged sharded checkpoint is named in one line, and an unfinished run read at its
newest checkpoint falls back to the one before; `export` and `fewshot --from` take the
HF folders `pretrained` builds."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import cli
from helpers import tiny_vit

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
# The tiny HF ViT the tests save: 32x32 images, 8x8 patches, width 32.
HF_TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=64)


@pytest.fixture(autouse=True)
def _empty_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KERAS_VIT_CACHE", str(home / "cache"))


def _error(capsys, command):
    """The one line a failed command printed (stderr), without its prefix."""
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.startswith(f"keras-vit {command}: error: ")]
    assert len(lines) == 1, lines
    return lines[0][len(f"keras-vit {command}: error: "):]


def _image(tmp_path, seed=0, side=32):
    path = str(tmp_path / f"image{seed}.png")
    keras.utils.save_img(path, np.random.default_rng(seed).integers(0, 256, (side, side, 3)))
    return path


def _hf_classifier(folder, labels=3, seed=0):
    torch.manual_seed(seed)
    config = transformers.ViTConfig(**HF_TINY, id2label={i: f"c{i}" for i in range(labels)})
    model = transformers.ViTForImageClassification(config).eval()
    model.save_pretrained(folder)
    return model


def _edit_config(folder, **changes):
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


# --- item 4: weights holding NaN are refused on every path that loads them ---------------


def test_predict_and_export_refuse_a_keras_file_holding_nan(tmp_path, capsys):
    model = tiny_vit()
    head = model.get_layer("head").kernel
    head.assign(np.full(head.shape, np.nan, "float32"))
    path = str(tmp_path / "diverged.keras")
    model.save(path)
    expected = f"Checkpoint {path} holds NaN or infinite values in head/kernel"
    assert cli.main(["predict", "--from", path, _image(tmp_path)]) == 2
    assert _error(capsys, "predict").startswith(expected)
    assert cli.main(["export", "--from", path, "--out", str(tmp_path / "served")]) == 2
    assert _error(capsys, "export").startswith(expected)
    assert not (tmp_path / "served").exists()
    with pytest.raises(ValueError, match=expected):
        keras_vit.load_pretrained(tiny_vit(), path)


# --- item 6: a source's config against its tensors; tensors that are not float -----------


@pytest.mark.parametrize("change, message", [
    (dict(patch_size=4), r"config.json says patch_size=4, but its weights' "
     r"vit.embeddings.patch_embeddings.projection.weight \(32, 3, 8, 8\) hold 8x8 patches"),
    (dict(id2label={str(i): f"c{i}" for i in range(5)}),
     r"config.json says num_labels=5, but its weights' classifier.weight \(3, 32\) hold 3 classes"),
], ids=["patch_size", "labels"])
def test_an_hf_folder_whose_config_disagrees_with_its_tensors_is_refused(
    tmp_path, capsys, change, message
):
    folder = tmp_path / "hf"
    _hf_classifier(folder)
    _edit_config(folder, **change)
    with pytest.raises(ValueError, match=message):
        keras_vit.pretrained(str(folder))
    assert cli.main(["predict", "--from", str(folder), _image(tmp_path)]) == 2
    assert "the config and the weights disagree" in _error(capsys, "predict")


def test_integer_tensors_are_refused_not_loaded(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "hf"
    _hf_classifier(folder)
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    save_file({k: (v * 100).astype("int32") for k, v in tensors.items()}, weights,
              metadata={"format": "pt"})
    with pytest.raises(ValueError, match=(
        rf"Checkpoint {folder} holds tensors that are not floating point, as weights are: "
        r"classifier.bias \(int32\), classifier.weight \(int32\), vit.embeddings.cls_token "
        r"\(int32\), .* and \d+ more; save them as float32")):
        keras_vit.pretrained(str(folder))
    # In the official layout too, whatever strict says.
    path = tmp_path / "vit.npz"
    keras_vit.save_npz(tiny_vit(), path)
    arrays = dict(np.load(path))
    arrays["cls"] = arrays["cls"].astype("int32")
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"holds tensors that are not floating point, as "
                                         r"weights are: cls \(int32\)"):
        keras_vit.load_pretrained(tiny_vit(), path, strict=False)


# --- item 10: a damaged sharded checkpoint of an unfinished run ---------------------------

# A JAX pretraining run on 4 host devices, fully sharded: its checkpoints are `.orbax`
# folders. Killed at the start of epoch 3, it leaves epochs 1 and 2 and no model.keras.
ORBAX_RUN = """
import os, signal, sys
import keras
from keras_vit import cli
from keras_vit.training import engine

class KillInEpoch3(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2:
            os.kill(os.getpid(), signal.SIGKILL)

train = engine.train
engine.train = lambda config, **kw: train(config, callbacks=[KillInEpoch3()], **kw)
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.slow  # a JAX run in a subprocess
def test_a_truncated_orbax_shard_is_named_and_the_run_falls_back_to_the_checkpoint_before(
    tmp_path, capsys
):
    pytest.importorskip("orbax.checkpoint")
    run = tmp_path / "run"
    settings = [
        "model.kwargs.hidden_dim=16", "model.kwargs.num_layers=1", "model.kwargs.num_heads=2",
        "model.kwargs.mlp_dim=32", "schedule.epochs=3", "schedule.micro_batches_per_epoch=2",
        "checkpointing.tensorboard=false", "data.batch_size=32", "distribution.strategy=fsdp",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3",
           "KERAS_BACKEND": "jax", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    process = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(ORBAX_RUN), "pretrain", "--recipe", "demo",
         "--data", "digits", "--out", str(run), *[a for s in settings for a in ("--set", s)]],
        env=env, capture_output=True, text=True, timeout=600,
    )
    checkpoints = run / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "epoch_0001.orbax", "epoch_0002.orbax"], process.stderr[-3000:]
    images = [_image(tmp_path, seed, side=8) for seed in range(2)]
    assert cli.main(["predict", "--from", str(checkpoints / "epoch_0001.orbax"), *images,
                     "--json"]) == 0
    epoch_1 = json.loads(capsys.readouterr().out)
    # One shard's metadata cut in half, as a disk that filled up leaves it.
    damaged = checkpoints / "epoch_0002.orbax"
    shard = damaged / "variables" / "array_metadatas" / "process_0"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])

    assert cli.main(["predict", "--from", str(run), *images, "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == epoch_1
    warnings = captured.err.strip().splitlines()
    assert len(warnings) == 1, captured.err[-3000:]
    assert warnings[0].startswith(f"keras-vit: {damaged} is damaged: a file in it is truncated "
                                  "or corrupt (")
    assert warnings[0].endswith(
        f"Reading the checkpoint before it: {checkpoints / 'epoch_0001.orbax'}.")
    # Named itself, the damaged checkpoint is refused in one line.
    assert cli.main(["predict", "--from", str(damaged), *images]) == 2
    assert _error(capsys, "predict").startswith(f"{damaged} is damaged")


# --- item 11: config.json not JSON, or of another model type ------------------------------


def test_a_config_json_that_is_not_json_is_named(tmp_path, capsys):
    folder = tmp_path / "hf"
    _hf_classifier(folder)
    (folder / "config.json").write_text('{"architectures": ["ViTForImageClassification"],')
    message = f"{folder / 'config.json'} is not valid JSON ("
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        keras_vit.pretrained(str(folder))
    argv = ["finetune", "--from", str(folder), "--data", "digits", "--out", str(tmp_path / "ft")]
    assert cli.main(argv) == 2
    assert _error(capsys, "finetune").startswith(message)


@pytest.mark.parametrize("model_type, said", [(None, "has no model_type"),
                                              ("swin", "has model_type='swin'")])
def test_a_dinov2_folder_naming_no_or_another_model_type_is_named(
    tmp_path, capsys, model_type, said
):
    folder = tmp_path / "dinov2"
    config = transformers.Dinov2Config(**HF_TINY)
    transformers.Dinov2Model(config).save_pretrained(folder)
    _edit_config(folder, model_type=model_type)
    message = (f"{folder / 'config.json'} {said}, but its architecture Dinov2Model is a "
               "'dinov2' model")
    with pytest.raises(ValueError, match=message):
        keras_vit.pretrained(str(folder))
    argv = ["finetune", "--from", str(folder), "--data", "digits", "--out", str(tmp_path / "ft")]
    assert cli.main(argv) == 2
    assert _error(capsys, "finetune").startswith(message)


# --- item 12: every --from takes every source pretrained takes ----------------------------


def test_export_from_an_hf_folder_serves_what_transformers_computes(tmp_path, capsys):
    folder = tmp_path / "hf"
    reference = _hf_classifier(folder, labels=3, seed=1)
    assert cli.main(["export", "--from", str(folder), "--out", str(tmp_path / "served")]) == 0
    pixels = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3)).astype("uint8")
    served = tf.saved_model.load(str(tmp_path / "served")).signatures["serving_default"]
    probabilities = served(images=tf.constant(pixels))["probabilities"].numpy()
    # HF's ViT image processor: pixels / 255, normalised by mean and std 0.5.
    inputs = torch.from_numpy((pixels / 127.5 - 1).astype("float32")).permute(0, 3, 1, 2)
    with torch.no_grad():
        expected = torch.softmax(reference(pixel_values=inputs).logits, -1).numpy()
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)


def test_fewshot_from_an_hf_folder_evaluates_its_features(tmp_path, capsys):
    folder = tmp_path / "vit-backbone"
    config = transformers.ViTConfig(**{**HF_TINY, "image_size": 8, "patch_size": 4},
                                    num_channels=1)
    transformers.ViTModel(config).save_pretrained(folder)  # its pooler_output: pre_logits
    out = tmp_path / "fewshot"
    argv = ["fewshot", "--from", str(folder), "--data", "digits", "--classes", "5-9",
            "--shots", "1,3", "--seeds", "1", "--out", str(out)]
    assert cli.main(argv) == 0, capsys.readouterr().err
    results = json.loads((out / "fewshot.json").read_text())
    assert "vit-backbone" in json.dumps(results)
