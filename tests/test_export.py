"""SavedModel export: the served graph answers like the Keras model, from TF and JAX.

One module fixture trains a tiny ViT, saves it as .keras, exports it here (TensorFlow)
and, in a subprocess, under JAX; one more subprocess that imports neither keras nor
keras_vit serves both SavedModels. The tests compare what it served with the Keras
model's outputs computed here.
"""

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
from PIL import Image

tf = pytest.importorskip("tensorflow", reason="SavedModel export is TensorFlow's")

import keras_vit  # noqa: E402
from helpers import randomise_weights, tiny_vit  # noqa: E402
from keras_vit.export.saved_model import CONFIG_FILE, export_saved_model  # noqa: E402

pytestmark = pytest.mark.gpu  # the accelerator subset (pyproject.toml's markers)

ROOT = Path(__file__).resolve().parents[1]
LABELS = [f"class_{i}" for i in range(10)]
TOP_K = 3
# The model's own size (only scaled) and another (resized), each at batch 7 and 1.
SIZES = {"own": (32, 32), "other": (45, 37)}
BATCHES = (7, 1)

# Builds the model from the .keras file under the JAX backend and exports it, with
# activation="sigmoid" and without labels, to cover those options too.
JAX_EXPORT = """
import json, sys
import keras
import keras_vit

assert "tensorflow" not in sys.modules, "importing keras_vit under JAX imported TensorFlow"
from keras_vit import export_saved_model

plan = json.load(open(sys.stdin.readline().strip()))
model = keras.saving.load_model(plan["keras_file"], compile=False)
export_saved_model(model, plan["jax_export"], top_k=plan["top_k"], activation="sigmoid")
"""

# Serves both SavedModels with TensorFlow alone. `import tensorflow` imports keras when
# it is installed (to register its optimizers), so keras and keras_vit are made
# unimportable first: None in sys.modules makes `import keras` raise ImportError.
SERVE = """
import json, sys
sys.modules["keras"] = sys.modules["keras_vit"] = None
import numpy as np
import tensorflow as tf

plan = json.load(open(sys.stdin.readline().strip()))
results = {}

def as_lists(outputs):
    return {
        key: [[v.decode() for v in row] for row in value.numpy()]
        if value.dtype == tf.string else value.numpy().tolist()
        for key, value in outputs.items()
    }

def error(call):
    try:
        call()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None

for name in ("tf_export", "jax_export"):
    loaded = tf.saved_model.load(plan[name])
    served = loaded.signatures["serving_default"]
    from_bytes = loaded.signatures["serving_bytes"]
    out = results[name] = {"signatures": sorted(loaded.signatures)}
    for size, path in plan["images"].items():
        images = np.load(path)
        pngs = [open(p, "rb").read() for p in plan["pngs"][size]]
        for batch in plan["batches"]:
            key = f"{size}/{batch}"
            out["images/" + key] = as_lists(served(images=tf.constant(images[:batch])))
            out["bytes/" + key] = as_lists(from_bytes(image_bytes=tf.constant(pngs[:batch])))
    own = np.load(plan["images"]["own"])
    out["logits"] = loaded.signatures["logits"](
        images=tf.constant(own, tf.float32))["logits"].numpy().tolist()
    out["float_error"] = error(lambda: served(images=tf.constant(own, tf.float32)))
    out["channels_error"] = error(lambda: served(images=tf.constant(own[..., :2])))

results["imported"] = sorted(
    name for name, module in sys.modules.items()
    if name.split(".")[0] in ("keras", "keras_vit") and module is not None
)
json.dump(results, open(plan["served"], "w"))
"""


def _start(script, cwd, **env):
    """Starts `script`, which imports its libraries then waits for a plan path on stdin."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)], cwd=cwd, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


def _go(process, plan_path):
    process.stdin.write(f"{plan_path}\n")
    process.stdin.flush()


def _finish(process):
    log = process.communicate(timeout=600)[0]
    assert process.returncode == 0, log[-5000:]


def _softmax(logits):
    logits = logits - logits.max(-1, keepdims=True)
    return np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)


def _png(image):
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Trains, saves, exports from TF and JAX, serves; returns everything to compare."""
    tmp = tmp_path_factory.mktemp("export")
    plan_path = tmp / "plan.json"
    # Both subprocesses import (the slow part) while this process trains and exports.
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "PYTHONPATH")}
    jax = _start(
        JAX_EXPORT, tmp, **env, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT)
    )
    serve = _start(SERVE, tmp, **env)
    try:
        return _train_export_and_serve(tmp, plan_path, jax, serve)
    finally:
        for process in (jax, serve):
            if process.poll() is None:
                process.kill()
                process.wait()


def _train_export_and_serve(tmp, plan_path, jax, serve):
    keras.utils.set_random_seed(0)
    model = tiny_vit()
    rng = randomise_weights(model, seed=0, scale=0.5)  # probabilities far from uniform
    schedule = keras.optimizers.schedules.CosineDecay(0.0, 10, warmup_target=1e-3, warmup_steps=2)
    model.compile(
        keras.optimizers.AdamW(schedule, weight_decay=0.1, global_clipnorm=1.0),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        run_eagerly=True,  # tracing a train step takes longer than these two steps
    )
    train = rng.integers(0, 256, size=(16, 32, 32, 3), dtype="uint8")
    model.fit(keras_vit.preprocess(train), rng.integers(0, 10, size=16), batch_size=8, verbose=0)
    model.save(tmp / "vit.keras")
    loaded = keras.saving.load_model(tmp / "vit.keras")

    plan = {
        "keras_file": str(tmp / "vit.keras"), "tf_export": str(tmp / "tf"),
        "jax_export": str(tmp / "jax"), "served": str(tmp / "served.json"),
        "top_k": TOP_K, "batches": BATCHES, "images": {}, "pngs": {},
    }
    images, pixels = {}, {}
    for size, (height, width) in SIZES.items():
        images[size] = rng.integers(0, 256, size=(7, height, width, 3), dtype="uint8")
        np.save(tmp / f"{size}.npy", images[size])
        plan["images"][size] = str(tmp / f"{size}.npy")
        # The eval resize, done here by TensorFlow outside the served graph.
        pixels[size] = images[size] if (height, width) == (32, 32) else (
            tf.image.resize(images[size], (32, 32), method="bilinear").numpy()
        )
        plan["pngs"][size] = []
        for i, image in enumerate(images[size]):
            (tmp / f"{size}_{i}.png").write_bytes(_png(image))
            plan["pngs"][size].append(str(tmp / f"{size}_{i}.png"))
    plan_path.write_text(json.dumps(plan))

    _go(jax, plan_path)
    metadata = {"checkpoint": plan["keras_file"]}
    record = export_saved_model(
        loaded, tmp / "tf", labels=LABELS, top_k=TOP_K, metadata=metadata
    )
    _finish(jax)
    _go(serve, plan_path)
    _finish(serve)

    logits = {
        size: keras.ops.convert_to_numpy(model(keras_vit.preprocess(pixels[size])))
        for size in SIZES
    }
    return dict(
        model=model, loaded=loaded, record=record, tmp=tmp, train=train, logits=logits,
        served=json.loads(Path(plan["served"]).read_text()),
    )


@pytest.mark.slow  # uses `run`: a JAX export process and a serving process
def test_trained_model_round_trips_exactly_through_keras_file(run):
    model, loaded = run["model"], run["loaded"]
    x = keras_vit.preprocess(run["train"])
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(x)), keras.ops.convert_to_numpy(model(x))
    )
    for saved, restored in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(restored), keras.ops.convert_to_numpy(saved)
        )
    assert int(loaded.optimizer.iterations) == 2


@pytest.mark.slow  # uses `run`: a JAX export process and a serving process
def test_serving_process_imported_neither_keras_nor_keras_vit(run):
    assert run["served"]["imported"] == []
    assert run["served"]["tf_export"]["signatures"] == ["logits", "serving_bytes", "serving_default"]


@pytest.mark.slow  # uses `run`: a JAX export process and a serving process
@pytest.mark.parametrize("signature", ["images", "bytes"])
@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("batch", BATCHES)
def test_tensorflow_export_serves_the_keras_models_probabilities(run, signature, size, batch):
    served = run["served"]["tf_export"][f"{signature}/{size}/{batch}"]
    expected = _softmax(run["logits"][size][:batch].astype("float64"))
    assert expected.max() > 0.5  # far from uniform, so the comparison means something
    np.testing.assert_allclose(served["probabilities"], expected, rtol=0, atol=1e-5)
    top = np.argsort(-expected, axis=1)[:, :TOP_K]
    np.testing.assert_array_equal(served["top_k_indices"], top)
    np.testing.assert_allclose(
        served["top_k_probabilities"], np.take_along_axis(expected, top, 1), rtol=0, atol=1e-5
    )
    assert served["top_k_labels"] == [[LABELS[i] for i in row] for row in top]


@pytest.mark.slow  # uses `run`: a JAX export process and a serving process
@pytest.mark.parametrize("signature", ["images", "bytes"])
@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("batch", BATCHES)
def test_jax_export_serves_the_keras_models_probabilities(run, signature, size, batch):
    served = run["served"]["jax_export"][f"{signature}/{size}/{batch}"]
    expected = 1 / (1 + np.exp(-run["logits"][size][:batch].astype("float64")))
    np.testing.assert_allclose(served["probabilities"], expected, rtol=0, atol=1e-5)
    top = np.argsort(-expected, axis=1)[:, :TOP_K]
    np.testing.assert_array_equal(served["top_k_indices"], top)
    assert "top_k_labels" not in served  # exported without labels


@pytest.mark.slow  # uses `run`: a JAX export process and a serving process
def test_logits_signature_takes_pixels_at_the_models_size(run):
    np.testing.assert_allclose(
        run["served"]["tf_export"]["logits"], run["logits"]["own"], rtol=0, atol=1e-5
    )


@pytest.mark.slow  # uses `run`: a JAX export process and a serving process
@pytest.mark.parametrize("export", ["tf_export", "jax_export"])
def test_wrong_dtype_and_channel_count_are_readable_errors(run, export):
    served = run["served"][export]
    assert "expected to be a uint8 tensor but is a float tensor" in served["float_error"]
    assert "images must have 3 channels (the model's channel count)" in served[
        "channels_error"
    ].replace("\\'", "'")
    assert "[2]" in served["channels_error"]  # the channel count that was sent


@pytest.mark.slow  # uses `run`: a JAX export process and a serving process
def test_export_folder_carries_the_model_config(run):
    path = run["tmp"] / "tf" / CONFIG_FILE
    record = json.loads(path.read_text())
    assert record == run["record"]
    rebuilt = keras.models.model_from_json(json.dumps(record["model"]))
    assert json.loads(rebuilt.to_json()) == json.loads(run["model"].to_json())
    assert record["labels"] == LABELS
    assert (record["image_size"], record["channels"], record["activation"]) == ([32, 32], 3, "softmax")
    assert record["metadata"] == {"checkpoint": str(run["tmp"] / "vit.keras")}
    assert record["backend"] == "tensorflow"
    jax_record = json.loads((run["tmp"] / "jax" / CONFIG_FILE).read_text())
    assert (jax_record["backend"], jax_record["activation"]) == ("jax", "sigmoid")


@pytest.mark.parametrize(
    "model_kwargs, kwargs, message",
    [
        ({}, dict(labels=["cat", "dog"]), r"Got 2 labels for a model with 10 classes"),
        ({}, dict(top_k=0), r"top_k must be a positive int, got 0"),
        ({}, dict(activation="relu"), r"Unknown activation 'relu': expected one of 'softmax', 'sigmoid'"),
        (dict(include_top=False), {}, r"a `head` layer .* output shapes \[\(None, 32\)\] and no head"),
        ({}, dict(metadata={"seed": np.int64(0)}), r"metadata must be JSON-serialisable, got \{'seed'"),
        ({}, dict(crop_fraction=1.5), r"crop_fraction must be in \(0, 1\] or None, got 1.5"),
        ({}, dict(native_resolution=True), r"native_resolution=True .* needs a model built with .*dynamic_image_size=True\); model 'vit' takes input shape \(None, 32, 32, 3\)"),
        (dict(dynamic_image_size=True), dict(native_resolution=True, crop_fraction=0.875),
         r"crop_fraction=0.875 crops images to the model's size, but native_resolution=True"),
    ],
)
def test_bad_export_arguments_raise_clear_errors(tmp_path, model_kwargs, kwargs, message):
    with pytest.raises(ValueError, match=message):
        export_saved_model(tiny_vit(**model_kwargs), tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_export_command_default_top_k_fits_a_three_class_model(tmp_path, capsys, caplog):
    # `keras-vit export` asks for the top 5 by default; a 3-class model returns all 3.
    from keras_vit import cli

    tiny_vit(num_classes=3).save(tmp_path / "three.keras")
    with caplog.at_level("INFO", logger="keras_vit"):
        assert cli.main(["export", "--from", str(tmp_path / "three.keras"), "--out", str(tmp_path / "served")]) == 0
    assert "top_k 5 is more than the model's 3 classes: returning all 3" in caplog.text
    assert "top 3" in capsys.readouterr().out
    served = tf.saved_model.load(str(tmp_path / "served")).signatures["serving_default"]
    out = served(images=tf.zeros((2, 32, 32, 3), tf.uint8))
    assert out["top_k_indices"].shape.as_list() == [2, 3]
    assert sorted(out["top_k_indices"].numpy()[0]) == [0, 1, 2]


# Exports a dynamic-size model (one that pads) under JAX with native_resolution=True.
JAX_NATIVE_EXPORT = """
import sys
import keras
import keras_vit

model = keras.saving.load_model(sys.argv[1], compile=False)
keras_vit.export_saved_model(model, sys.argv[2], native_resolution=True)
"""

# Serves native-resolution SavedModels with TensorFlow alone, as SERVE does.
SERVE_NATIVE = """
import json, sys
sys.modules["keras"] = sys.modules["keras_vit"] = None
import numpy as np
import tensorflow as tf

plan = json.load(open(sys.argv[1]))
results = {}
for export, images in plan["images"].items():
    loaded = tf.saved_model.load(plan["exports"][export])
    served = loaded.signatures["serving_default"]
    for path in images:
        batch = tf.constant(np.load(path))
        results[path] = served(images=batch)["probabilities"].numpy().tolist()
    pngs = tf.constant([open(p, "rb").read() for p in plan["pngs"][export]])
    results["bytes/" + export] = loaded.signatures["serving_bytes"](
        image_bytes=pngs)["probabilities"].numpy().tolist()
    try:
        served(images=tf.zeros((1, 30, 32, 3), tf.uint8))
    except Exception as e:
        results["error/" + export] = str(e)
results["imported"] = sorted(
    name for name, module in sys.modules.items()
    if name.split(".")[0] in ("keras", "keras_vit") and module is not None
)
json.dump(results, open(plan["served"], "w"))
"""


@pytest.mark.slow  # a JAX export process and a serving process
def test_native_resolution_export_serves_each_image_at_its_own_size(tmp_path, capsys):
    """From TensorFlow (a model that needs multiples of the patch size, exported by
    `keras-vit export --native-resolution`) and from JAX (a model that pads)."""
    from keras_vit import cli

    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "PYTHONPATH")}
    models = {"tf": tiny_vit(dynamic_image_size=True),
              "jax": tiny_vit(dynamic_image_size=True, dynamic_image_pad=True)}
    rng = np.random.default_rng(0)
    for export, model in models.items():
        randomise_weights(model, seed=len(export), scale=0.5)
        model.save(tmp_path / f"{export}.keras")
    jax = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(JAX_NATIVE_EXPORT), str(tmp_path / "jax.keras"),
         str(tmp_path / "jax")],
        cwd=tmp_path, env={**env, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
                           "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert cli.main(["export", "--from", str(tmp_path / "tf.keras"),
                     "--out", str(tmp_path / "tf"), "--native-resolution"]) == 0
    assert "each image at its own size" in capsys.readouterr().out
    record = json.loads((tmp_path / "tf" / CONFIG_FILE).read_text())
    assert (record["native_resolution"], record["image_size"]) == (True, [32, 32])
    _finish(jax)

    sizes = {"tf": [(32, 32), (48, 24)], "jax": [(32, 32), (30, 17)]}
    plan = {"exports": {e: str(tmp_path / e) for e in sizes}, "served": str(tmp_path / "served.json"),
            "images": {e: [] for e in sizes}, "pngs": {e: [] for e in sizes}}
    images = {}
    for export, shapes in sizes.items():
        for height, width in shapes:
            path = str(tmp_path / f"{export}_{height}x{width}.npy")
            images[path] = rng.integers(0, 256, size=(3, height, width, 3), dtype="uint8")
            np.save(path, images[path])
            plan["images"][export].append(path)
            (tmp_path / f"{export}_{height}x{width}.png").write_bytes(_png(images[path][0]))
            plan["pngs"][export].append(str(tmp_path / f"{export}_{height}x{width}.png"))
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SERVE_NATIVE), str(tmp_path / "plan.json")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    served = json.loads(Path(plan["served"]).read_text())
    assert served["imported"] == []

    for export, model in models.items():
        expected = {path: _softmax(keras.ops.convert_to_numpy(model(keras_vit.preprocess(images[path]))))
                    for path in plan["images"][export]}
        for path in plan["images"][export]:
            np.testing.assert_allclose(served[path], expected[path], rtol=0, atol=1e-5)
        # The encoded files, of two sizes in one batch, each at its own size.
        firsts = [expected[path][0] for path in plan["images"][export]]
        np.testing.assert_allclose(served["bytes/" + export], firsts, rtol=0, atol=1e-5)
    assert "height and width must be multiples of 8" in served["error/tf"]
    assert "error/jax" not in served  # the padding model takes 30x32 too
