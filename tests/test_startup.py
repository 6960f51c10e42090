"""Start-up (issue 48, item 16): a user's mistake is told, and `keras-vit weights` prints
its table, before Keras or a backend is imported.

Each case runs the command in a fresh process and lists the backends imported when it
returns: none. (bench/startup.py times the same commands.)
"""

import json
import subprocess
import sys

import pytest

from helpers import ROOT, clean_environment, tiny_vit

BACKENDS = ("keras", "tensorflow", "jax", "torch")
SCRIPT = (
    "import json, sys\n"
    "for name in json.loads(sys.argv[2]):\n"
    "    sys.modules[name] = None  # how Python reports a package that is not installed\n"
    "from keras_vit import cli\n"
    "rc = cli.main(json.loads(sys.argv[1]))\n"
    f"print(json.dumps([rc, sorted(m for m in {BACKENDS!r} if sys.modules.get(m))]))\n"
)


def run_command(args, cwd, not_installed=(), backend="tensorflow"):
    """`keras-vit ARGS` in a new process: (exit code, backends imported, stdout, stderr)."""
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(args), json.dumps(list(not_installed))],
        cwd=cwd, capture_output=True, text=True,
        env=clean_environment(PYTHONPATH=str(ROOT), KERAS_BACKEND=backend),
    )
    *out, last = result.stdout.splitlines()
    rc, imported = json.loads(last)
    return rc, imported, "".join(line + "\n" for line in out), result.stderr


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.keras"
    tiny_vit().save(path)
    return str(path)


@pytest.mark.parametrize(
    "command",
    [
        ["predict", "--from", "{missing}", "{model}"],
        ["export", "--from", "{missing}", "--out", "{tmp}/exported"],
        ["finetune", "--from", "{missing}", "--out", "{tmp}/run"],
        ["fewshot", "--from", "{missing}"],
        ["visualize", "--from", "{missing}", "--image", "{model}", "--out", "{tmp}/v"],
        ["probe", "--from", "{missing}", "--out", "{tmp}/p"],
    ],
    ids=lambda command: command[0],
)
def test_a_missing_from_folder_is_told_before_keras_starts(command, tmp_path, model_file):
    missing = str(tmp_path / "runs" / "no_such_run")
    args = [a.format(missing=missing, model=model_file, tmp=tmp_path) for a in command]
    rc, imported, out, err = run_command(args, tmp_path)
    assert (rc, imported, out) == (2, [], "")
    assert err == (
        f"keras-vit {command[0]}: error: --from {missing!r} does not exist: pass a run's "
        "output folder, a .keras file, a checkpoint file, a registry name (keras-vit "
        "weights), hf:ORG/NAME or timm:NAME.\n"
    )


def test_a_missing_image_is_told_before_keras_starts(tmp_path, model_file):
    image = str(tmp_path / "photo.jpg")
    rc, imported, _, err = run_command(["predict", "--from", model_file, image], tmp_path)
    assert (rc, imported) == (2, [])
    assert err == f"keras-vit predict: error: No such image file: {image!r}; nothing to classify.\n"

    args = ["visualize", "--from", model_file, "--image", image, "--out", str(tmp_path / "v")]
    rc, imported, _, err = run_command(args, tmp_path)
    assert (rc, imported) == (2, [])
    assert err == f"keras-vit visualize: error: No such file (--image): {image!r}.\n"


def test_an_unknown_registry_name_is_told_before_keras_starts(tmp_path):
    rc, imported, _, err = run_command(
        ["predict", "--weights", "vit_base_patch16_224.augreg_in21k_ft_in1kk", "x.jpg"], tmp_path
    )
    assert (rc, imported) == (2, [])
    assert err.startswith(
        "keras-vit predict: error: Unknown weights 'vit_base_patch16_224.augreg_in21k_ft_in1kk': "
        "did you mean vit_base_patch16_224.augreg_in21k_ft_in1k, "
    )


def test_a_missing_extra_is_told_before_keras_starts(tmp_path, model_file):
    args = ["export", "--from", model_file, "--format", "onnx", "--out", str(tmp_path / "v.onnx")]
    rc, imported, _, err = run_command(args, tmp_path, not_installed=["onnx"])
    assert (rc, imported) == (2, [])
    assert err == (
        "keras-vit export: error: ONNX export needs onnx, which is not installed: "
        'pip install "keras3-vit[export]".\n'
    )
    args = ["fewshot", "--from", "timm:vit_tiny_patch16_224.augreg_in21k"]
    rc, imported, _, err = run_command(args, tmp_path, not_installed=["huggingface_hub"])
    assert (rc, imported) == (2, [])
    assert err == (
        "keras-vit fewshot: error: Loading hf: or timm: weights needs huggingface_hub, which "
        'is not installed: pip install "keras3-vit[hf]".\n'
    )


@pytest.mark.parametrize("command", [["demo"], ["pretrain", "--recipe", "demo"]])
def test_training_on_pytorch_is_told_before_keras_starts(command, tmp_path):
    rc, imported, _, err = run_command(command, tmp_path, backend="torch")
    assert (rc, imported) == (2, [])
    assert err == (
        f"keras-vit {command[0]}: error: keras-vit {command[0]} trains on the TensorFlow or "
        "the JAX backend, not 'torch': set KERAS_BACKEND=tensorflow or jax (the models it "
        "writes load on PyTorch too).\n"
    )
    assert not (tmp_path / "runs").exists()


def test_weights_prints_the_same_table_without_keras(tmp_path):
    rc, imported, out, err = run_command(["weights"], tmp_path)
    assert (rc, imported, err) == (0, [], "")
    # The same command in a new process where Keras is imported first prints the same
    # table (not this process's: other tests register entries of their own here).
    with_keras = subprocess.run(
        [sys.executable, "-c", "import keras, sys; from keras_vit import cli; "
         "sys.exit(cli.main(['weights']))"],
        cwd=tmp_path, capture_output=True, text=True,
        env=clean_environment(PYTHONPATH=str(ROOT), KERAS_BACKEND="tensorflow"),
    )
    assert with_keras.returncode == 0, with_keras.stderr
    assert out == with_keras.stdout
    assert "vit_base_patch16_224.augreg_in21k_ft_in1k" in out
