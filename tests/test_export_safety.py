"""Exports are safe to use and to write: every format refuses input of another shape
than the model's (not read as other images), and an export killed while it is written
leaves the previous export loadable."""

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.export.onnx import export_onnx
from keras_vit.export.saved_model import export_saved_model
from keras_vit.export.tflite import export_tflite, run_tflite

onnxruntime = pytest.importorskip("onnxruntime")

# A (1, 16, 16, 3) batch holds as many numbers as three (16, 16, 1) images: a file that
# does not check the shape returns three rows for it (the case as found).
WRONG_SHAPES = [(1, 16, 16, 3), (1, 8, 32, 1)]


def grey_model():
    return keras_vit.ViT(image_size=16, patch_size=8, hidden_dim=16, num_layers=1,
                         num_heads=2, mlp_dim=32, num_classes=4, channels=1)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exports")
    model = grey_model()
    paths = dict(
        tflite=folder / "float.tflite", int8=folder / "int8.tflite",
        onnx=folder / "model.onnx", saved_model=folder / "saved_model",
    )
    export_tflite(model, paths["tflite"])
    export_tflite(model, paths["int8"], quantize="dynamic-int8")
    export_onnx(model, paths["onnx"])
    export_saved_model(model, paths["saved_model"])
    return paths


@pytest.mark.parametrize("shape", WRONG_SHAPES)
@pytest.mark.parametrize("kind", ["tflite", "int8"])
def test_litert_refuses_images_of_another_shape(exports, kind, shape):
    assert run_tflite(exports[kind], np.zeros((2, 16, 16, 1), "float32")).shape == (2, 4)
    with pytest.raises(ValueError, match=rf"takes images of shape \('batch', 16, 16, 1\), "
                                         rf"got \({shape[0]}, {shape[1]}, {shape[2]}, {shape[3]}\)"):
        run_tflite(exports[kind], np.zeros(shape, "float32"))


@pytest.mark.parametrize("shape", WRONG_SHAPES)
def test_onnx_refuses_images_of_another_shape(exports, shape):
    session = onnxruntime.InferenceSession(str(exports["onnx"]),
                                           providers=["CPUExecutionProvider"])
    assert session.run(None, {"images": np.zeros((2, 16, 16, 1), "float32")})[0].shape == (2, 4)
    with pytest.raises(Exception, match="Got invalid dimensions for input: images"):
        session.run(None, {"images": np.zeros(shape, "float32")})


@pytest.mark.parametrize("shape", WRONG_SHAPES)
def test_saved_model_logits_signature_refuses_pixels_of_another_shape(exports, shape):
    logits = tf.saved_model.load(str(exports["saved_model"])).signatures["logits"]
    assert logits(images=tf.zeros((2, 16, 16, 1)))["logits"].shape == (2, 4)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"pixels must have 1 channels .* and height and width 16, 16"):
        logits(images=tf.zeros(shape))


def test_saved_model_serving_signature_refuses_another_channel_count(exports):
    served = tf.saved_model.load(str(exports["saved_model"])).signatures["serving_default"]
    assert served(images=tf.zeros((2, 20, 24, 1), tf.uint8))["probabilities"].shape == (2, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="images must have 1 channels"):
        served(images=tf.zeros((1, 16, 16, 3), tf.uint8))


# --- a kill while exporting leaves the previous export ------------------------------

EXPORTER = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import keras_vit
from keras_vit.demo import save_encoder
from keras_vit.export.onnx import export_onnx
from keras_vit.export.saved_model import export_saved_model
from keras_vit.export.tflite import export_tflite

folder, loop = sys.argv[1], sys.argv[2] == "loop"
model = keras_vit.ViT(image_size=16, patch_size=8, hidden_dim=16, num_layers=1, num_heads=2,
                      mlp_dim=48, num_classes=4, channels=1)
rng = np.random.default_rng(1)
for v in model.weights:
    v.assign(rng.normal(scale=0.2, size=v.shape).astype("float32"))
print("ready", flush=True)
while True:
    export_saved_model(model, os.path.join(folder, "saved_model"))
    export_onnx(model, os.path.join(folder, "model.onnx"))
    export_tflite(model, os.path.join(folder, "model.tflite"))
    keras_vit.save_npz(model, os.path.join(folder, "model.npz"))
    save_encoder(model, os.path.join(folder, "encoder.npz"))
    if not loop:
        break
"""


def seeded_model(seed, mlp_dim=32):
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_dim=16, num_layers=1,
                          num_heads=2, mlp_dim=mlp_dim, num_classes=4, channels=1)
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(scale=0.2, size=v.shape).astype("float32"))
    return model


def export_all(model, folder):
    from keras_vit.demo import save_encoder

    export_saved_model(model, folder / "saved_model")
    export_onnx(model, folder / "model.onnx")
    export_tflite(model, folder / "model.tflite")
    keras_vit.save_npz(model, folder / "model.npz")
    save_encoder(model, folder / "encoder.npz")


def served_outputs(folder, images, mlp_dim):
    """What each export in `folder` answers for `images` (pixels in [-1, 1])."""
    import json

    logits = tf.saved_model.load(str(folder / "saved_model")).signatures["logits"]
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"),
                                           providers=["CPUExecutionProvider"])
    loaded = seeded_model(2, mlp_dim)
    keras_vit.load_pretrained(loaded, folder / "model.npz")
    json.loads((folder / "model.tflite.json").read_text())
    encoder = np.load(folder / "encoder.npz")
    return dict(
        saved_model=logits(images=tf.constant((images + 1) * 127.5))["logits"].numpy(),
        onnx=session.run(None, {"images": images})[0],
        tflite=run_tflite(folder / "model.tflite", images),
        npz=np.asarray(loaded(images)),
        encoder=np.concatenate([encoder[k].ravel() for k in sorted(encoder.files)])[None],
    )


def _run_exporter(folder, env_extra=None, kill_after=None, kill_on_change=None):
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "TF_CPP_MIN_LOG_LEVEL": "3", **(env_extra or {})}
    process = subprocess.Popen(
        [sys.executable, "-c", EXPORTER, str(folder),
         "loop" if kill_after or kill_on_change else "once"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    if kill_after or kill_on_change:
        assert process.stdout.readline() == "ready\n"
    if kill_after:
        time.sleep(kill_after)
        process.kill()
    if kill_on_change:  # the moment a file of the export changes
        def state():
            info = os.stat(kill_on_change)
            return info.st_ino, info.st_mtime_ns, info.st_size

        before = state()
        while process.poll() is None and state() == before:
            time.sleep(0.001)
        process.kill()
    process.communicate(timeout=300)
    return process.returncode


@pytest.mark.slow
def test_an_export_killed_at_any_moment_leaves_the_previous_export(tmp_path):
    """Each export is re-written over a good one by a process killed (SIGKILL) in the
    middle of writing it (the test hook of `keras_vit.utils.files`, just before its
    rename), or at timed moments while it exports again and again: every file and
    folder then loads and answers as the old model or as the new one, whole."""
    import signal

    images = np.random.default_rng(5).uniform(-1, 1, (2, 16, 16, 1)).astype("float32")
    export_all(seeded_model(0), tmp_path)
    old = served_outputs(tmp_path, images, 32)
    # What the killed processes export: another model, wider (EXPORTER).
    export_all(seeded_model(1, mlp_dim=48), tmp_path / "new")
    new = served_outputs(tmp_path / "new", images, 48)

    def check(when):
        try:
            answers = served_outputs(tmp_path, images, 32)
        except Exception:
            answers = served_outputs(tmp_path, images, 48)  # all new, or failing
        for kind, answer in answers.items():
            assert any(answer.shape == known[kind].shape
                       and np.allclose(answer, known[kind], atol=1e-4)
                       for known in (old, new)), f"{kind} after a kill {when}"

    # Killed the moment the SavedModel's variables change: the old graph must not be
    # left beside new variables (as an export in place left it).
    _run_exporter(tmp_path, kill_on_change=tmp_path / "saved_model" / "variables"
                  / "variables.index")
    check("as the SavedModel's variables changed")

    for name in ("saved_model", "model.onnx", "model.tflite", "model.npz", "encoder.npz"):
        code = _run_exporter(tmp_path, {"KERAS_VIT_TEST_KILL_AT": f"{name}:1"})
        assert code == -signal.SIGKILL, f"not killed while writing {name}"
        check(f"while writing {name}")
    for seconds in (0.5, 2.0, 4.0):
        _run_exporter(tmp_path, kill_after=seconds)
        check(f"{seconds} s into exporting")
