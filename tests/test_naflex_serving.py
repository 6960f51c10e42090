"""A NaFlex model served at native resolution: SavedModel (TensorFlow's loader) and ONNX
(onnxruntime) exports of one tiny NaFlex classifier, run on photos of mixed aspect
ratios at two token counts against the Keras model; `keras-vit predict` and `classify`
on a folder of mixed-size JPEGs against the Keras model on `naflex_inputs` of the same
photos (decoded here by PIL), on TensorFlow, JAX and PyTorch; a fixed-grid model run as
its NaFlex twin; and the refusals, each naming the bad value.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_vit
from helpers import TINY, bucket_entry, randomise_weights, tiny_vit
from keras_vit import cli
from keras_vit.export.onnx import export_onnx, read_onnx_record
from keras_vit.export.records import SAVED_MODEL_RECORD
from keras_vit.export.saved_model import export_saved_model
from keras_vit.export.tflite import export_tflite
from keras_vit.models.naflex_mode import naflex_twin

onnxruntime = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="exports and starts the other backends from TensorFlow")
ROOT = Path(__file__).resolve().parents[1]
NAFLEX = dict(naflex=True, pos_interpolation="bilinear_antialias")
LABELS = ["cat", "dog", "bird"]
BUDGET = 16  # the tiny model's 4x4 table: its own token budget
TOKENS = (BUDGET, 40)  # two token counts served by one export


def _naflex_model(seed=5, **overrides):
    model = tiny_vit(num_classes=3, **{**NAFLEX, **overrides})
    randomise_weights(model, seed)
    return model


def _softmax(logits):
    logits = np.asarray(logits, "float64")
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A folder of JPEGs of mixed sizes (scikit-learn's photos and crops of other aspect
    ratios), their pixels as PIL decodes them, in the order predict lists them."""
    from sklearn.datasets import load_sample_images

    china, flower = load_sample_images().images
    crops = [china, flower[:100], china[50:300, 100:200], flower[:17, :33], china[100:190, 20:420]]
    folder = tmp_path_factory.mktemp("photos")
    paths = []
    for i, crop in enumerate(crops):
        paths.append(str(folder / f"photo{i}.jpg"))
        Image.fromarray(np.ascontiguousarray(crop)).save(paths[-1], quality=90)
    pixels = [np.asarray(Image.open(path).convert("RGB")) for path in paths]
    assert len({p.shape for p in pixels}) == len(pixels)  # every size differs
    return str(folder), paths, pixels


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory):
    model = _naflex_model()
    path = str(tmp_path_factory.mktemp("model") / "naflex.keras")
    model.save(path)
    return model, path


def _expected(model, pixels, tokens):
    """The Keras model's logits on `naflex_inputs` of `pixels` at `tokens` tokens."""
    inputs = keras_vit.naflex_inputs(pixels, patch_size=8, max_num_patches=tokens)
    return inputs, keras.ops.convert_to_numpy(model(inputs, training=False))


# --- exports ---------------------------------------------------------------------------


def _check_saved_model(folder, model, pixels):
    loaded = tf.saved_model.load(folder)
    for tokens in TOKENS:
        inputs, logits = _expected(model, pixels, tokens)
        assert inputs["patches"].shape[1] == tokens
        served = loaded.signatures["serving_default"](
            **{name: tf.constant(value) for name, value in inputs.items()})
        np.testing.assert_allclose(served["probabilities"].numpy(), _softmax(logits),
                                   rtol=0, atol=1e-6)
        best = np.argsort(-logits, axis=-1, kind="stable")[:, :2]
        assert served["top_k_labels"].numpy().astype(str).tolist() == [
            [LABELS[i] for i in row] for row in best]
        raw = loaded.signatures["logits"](**{n: tf.constant(v) for n, v in inputs.items()})
        np.testing.assert_allclose(raw["logits"].numpy(), logits, rtol=0, atol=1e-5)
    return loaded


def test_saved_model_serves_mixed_sizes_at_two_token_counts(keras_file, photos, tmp_path):
    model, _ = keras_file
    folder = str(tmp_path / "served")
    record = export_saved_model(model, folder, labels=LABELS, top_k=2)
    loaded = _check_saved_model(folder, model, photos[2])
    with open(os.path.join(folder, SAVED_MODEL_RECORD)) as f:
        assert json.load(f) == record
    assert record["naflex"]["naflex"] is True
    assert (record["naflex"]["patch_size"], record["naflex"]["max_num_patches"]) == (8, BUDGET)
    assert record["naflex"]["inputs"]["patches"] == {"dtype": "float32",
                                                     "shape": ["batch", "tokens", 192]}
    assert record["signatures"] == ["serving_default", "logits"]
    assert record["preprocessing_config"]["interpolation"] == "bilinear"
    assert record["preprocessing"].startswith("NaFlex: each image resized, its aspect kept")
    signature = loaded.signatures["serving_default"].structured_input_signature[1]
    assert {name: (spec.shape.as_list(), spec.dtype.name) for name, spec in signature.items()} \
        == {"patches": ([None, None, 192], "float32"), "patch_mask": ([None, None], "int32"),
            "spatial_shapes": ([None, 2], "int32")}
    with pytest.raises(tf.errors.InvalidArgumentError, match="patch_mask must be"):
        loaded.signatures["serving_default"](
            patches=tf.zeros((2, 5, 192)), patch_mask=tf.zeros((2, 4), tf.int32),
            spatial_shapes=tf.ones((2, 2), tf.int32))


def _onnx_served(path, inputs):
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {x.name: inputs[x.name] for x in session.get_inputs()})[0]


def _check_onnx(path, model, pixels):
    for tokens in TOKENS:
        inputs, logits = _expected(model, pixels, tokens)
        np.testing.assert_allclose(_onnx_served(path, inputs), logits, rtol=0, atol=1e-5)


def test_onnx_serves_mixed_sizes_at_two_token_counts(keras_file, photos, tmp_path):
    model, _ = keras_file
    path = tmp_path / "naflex.onnx"
    record = export_onnx(model, path, labels=LABELS)
    _check_onnx(path, model, photos[2])
    assert read_onnx_record(path) == record
    assert record["naflex"]["max_num_patches"] == BUDGET and "input" not in record
    assert record["naflex"]["inputs"]["patch_mask"] == {"dtype": "int32",
                                                        "shape": ["batch", "tokens"]}


_OTHER_BACKEND_EXPORT = """
import sys, keras
from keras_vit.export.onnx import export_onnx
from keras_vit.export.saved_model import export_saved_model
model = keras.saving.load_model(sys.argv[1])
if keras.backend.backend() == "jax":
    export_saved_model(model, sys.argv[2], labels=["cat", "dog", "bird"], top_k=2)
try:
    export_onnx(model, sys.argv[3])
except ValueError as error:
    print("refused:", error)
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_exports_from_jax_and_torch(backend, keras_file, photos, tmp_path):
    """JAX: a SavedModel (jax2tf, symbolic batch and tokens), ONNX refused; PyTorch: ONNX."""
    model, path = keras_file
    saved, onnx_path = str(tmp_path / "served"), tmp_path / "naflex.onnx"
    result = subprocess.run(
        [sys.executable, "-c", _OTHER_BACKEND_EXPORT, path, saved, str(onnx_path)],
        cwd=ROOT, env={**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    if backend == "jax":
        _check_saved_model(saved, model, photos[2])
        assert result.stdout.strip() == (
            "refused: ONNX export of NaFlex model 'vit' needs the TensorFlow or PyTorch backend: "
            "jax2onnx gives its patch layer no token count to number the tokens by. Save it "
            "(model.save('model.keras')) and export it from a process started with "
            "KERAS_BACKEND=tensorflow.")
    else:
        _check_onnx(onnx_path, model, photos[2])


def test_litert_and_export_options_that_naflex_cannot_take_are_refused(keras_file, tmp_path):
    model, _ = keras_file
    with pytest.raises(ValueError, match=r"^LiteRT export refuses NaFlex model 'vit': its "
                                         r"varying token count .*--format saved_model or onnx"):
        export_tflite(model, tmp_path / "naflex.tflite")
    with pytest.raises(ValueError, match=r"^native_resolution=True does not apply to NaFlex model"):
        export_saved_model(model, str(tmp_path / "a"), native_resolution=True)
    with pytest.raises(ValueError, match=r"^crop_fraction=0.875 does not apply to NaFlex model"):
        export_saved_model(model, str(tmp_path / "b"), crop_fraction=0.875)
    with pytest.raises(ValueError, match=r"^crop_fraction=0.875 crops to the model's size, but "
                                         r"NaFlex model 'vit'"):
        export_onnx(model, tmp_path / "c.onnx", crop_fraction=0.875)
    assert not os.listdir(tmp_path)


def test_export_command_prints_the_naflex_inputs(keras_file, tmp_path, capsys):
    model, path = keras_file
    out = tmp_path / "naflex.onnx"
    assert cli.main(["export", "--from", path, "--format", "onnx", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(
        "Inputs patches float32 ['batch', 'tokens', 192], patch_mask int32 ['batch', 'tokens'], "
        "spatial_shapes int32 ['batch', 2]: NaFlex: each image resized")
    assert lines[2].startswith("Checked with onnxruntime against Keras on 3 random images of "
                               "mixed aspect ratios at 16 and 8 tokens: max |difference| ")
    assert cli.main(["export", "--from", path, "--out", str(tmp_path / "served")]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"SavedModel (softmax, top 3, NaFlex: 8-pixel patches, any token count, budget 16): "
        f"{tmp_path / 'served'}",
        "Inputs: keras_vit.naflex_inputs(images, patch_size=8, max_num_patches=16, "
        "preprocessing=record['preprocessing_config']); any token count is served (a larger "
        "budget: more detail, more compute).",
    ]
    assert cli.main(["export", "--from", path, "--format", "tflite",
                     "--out", str(tmp_path / "x.tflite")]) == 2
    assert capsys.readouterr().err.startswith(
        "keras-vit export: error: LiteRT export refuses NaFlex model 'vit'")


# --- predict and classify --------------------------------------------------------------


def _predict(*args, backend="tensorflow"):
    """`keras-vit predict ... --json` in a fresh process, as a user runs it."""
    result = subprocess.run(
        [sys.executable, "-m", "keras_vit", "predict", *args, "--json"],
        cwd=ROOT, env={**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    return json.loads(result.stdout)


def _probabilities(results, classes=3):
    """Each image's probabilities by class, from predict's top-k lists."""
    table = np.zeros((len(results), classes))
    for row, result in zip(table, results):
        for top in result["top_k"]:
            row[top["class"]] = top["probability"]
    return table


@pytest.mark.parametrize("backend", [
    "tensorflow", pytest.param("jax", marks=pytest.mark.slow),
    pytest.param("torch", marks=pytest.mark.slow)])
def test_predict_command_batches_a_folder_of_mixed_sizes(backend, keras_file, photos):
    model, path = keras_file
    folder, paths, pixels = photos
    # Batches of 2: the last one holds one image, padded to the batch size.
    results = _predict("--from", path, folder, "--top-k", "3", "--batch-size", "2",
                       backend=backend)
    assert [r["image"] for r in results] == paths
    _, logits = _expected(model, pixels, BUDGET)
    np.testing.assert_allclose(_probabilities(results), _softmax(logits), rtol=0, atol=2e-6)
    if backend == "tensorflow":  # another token budget, from the command line
        results = _predict("--from", path, folder, "--top-k", "3", "--max-num-patches", "40")
        _, logits = _expected(model, pixels, 40)
        np.testing.assert_allclose(_probabilities(results), _softmax(logits), rtol=0, atol=2e-6)


def test_predict_from_a_registry_name_of_a_naflex_classifier(bucket, photos, capsys):
    model = keras_vit.ViT(image_size=32, num_classes=1000, **TINY, **NAFLEX)
    randomise_weights(model, seed=7)
    bucket.put("test/naflex.npz", model)
    entry = bucket_entry("test_tiny_naflex.loopback", "test/naflex.npz",
                         model_args=dict(TINY, **NAFLEX))
    folder, paths, pixels = photos
    assert cli.main(["predict", "--weights", entry.name, folder, "--json", "--top-k", "1"]) == 0
    results = json.loads(capsys.readouterr().out)
    _, logits = _expected(model, pixels, BUDGET)
    probabilities = _softmax(logits)
    assert [r["top_k"][0]["class"] for r in results] == probabilities.argmax(-1).tolist()
    np.testing.assert_allclose([r["top_k"][0]["probability"] for r in results],
                               probabilities.max(-1), rtol=1e-5)


def test_a_fixed_grid_model_runs_as_its_naflex_twin(photos, tmp_path):
    folder, paths, pixels = photos
    plain = tiny_vit(num_classes=3, pos_interpolation="bilinear_antialias")
    randomise_weights(plain, seed=9)
    twin = naflex_twin(plain)
    assert [v.path for v in twin.weights] == [v.path for v in plain.weights]
    for ours, theirs in zip(twin.weights, plain.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    # An independent NaFlex model of the architecture, holding the same weights.
    reference = tiny_vit(num_classes=3, **NAFLEX)
    reference.set_weights(plain.get_weights())
    _, logits = _expected(reference, pixels, 24)
    results = keras_vit.classify(plain, folder, top_k=3, naflex=True, max_num_patches=24)
    np.testing.assert_allclose(_probabilities(results), _softmax(logits), rtol=0, atol=2e-6)
    # On the command line, from a .keras file.
    plain.save(tmp_path / "plain.keras")
    results = _predict("--from", str(tmp_path / "plain.keras"), folder, "--naflex",
                       "--max-num-patches", "24", "--top-k", "3")
    np.testing.assert_allclose(_probabilities(results), _softmax(logits), rtol=0, atol=2e-6)


def test_a_packed_model_serves_one_image_per_row(photos, tmp_path):
    """A model trained on packed rows (`images_per_row`) classifies and exports as its
    one-image-per-row twin: the outputs of the unpacked NaFlex model holding its weights."""
    folder, _, pixels = photos
    packed = _naflex_model(images_per_row=3)
    unpacked = _naflex_model(seed=0)
    unpacked.set_weights(packed.get_weights())
    _, logits = _expected(unpacked, pixels, BUDGET)
    results = keras_vit.classify(packed, folder, top_k=3)
    np.testing.assert_allclose(_probabilities(results), _softmax(logits), rtol=0, atol=2e-6)
    assert naflex_twin(unpacked) is unpacked
    # Its exports take one image per row too.
    export_saved_model(packed, str(tmp_path / "served"), labels=LABELS, top_k=2)
    _check_saved_model(str(tmp_path / "served"), unpacked, pixels)
    export_onnx(packed, tmp_path / "packed.onnx")
    _check_onnx(tmp_path / "packed.onnx", unpacked, pixels)


@pytest.mark.parametrize("build, kwargs, message", [
    (lambda: tiny_vit(image_size=32, patch_size=1, num_layers=1, resnet_stages=(1, 1)),
     dict(naflex=True),
     r"^Model 'vit' has no NaFlex twin: resnet_stages=\(1, 1\) \(a hybrid's ResNet stem"),
    (lambda: tiny_vit(distilled=True), dict(naflex=True),
     r"^Model 'vit' has no NaFlex twin: distilled=True \(DeiT's distillation head"),
    (lambda: tiny_vit(), dict(max_num_patches=24),
     r"^max_num_patches=24 is a NaFlex token budget, but model 'vit' takes images at its own "
     r"size: pass naflex=True \(--naflex\) too"),
    (lambda: tiny_vit(), dict(naflex=True, crop_fraction=0.875),
     r"^crop_fraction=0.875 crops to the model's size, but NaFlex takes each whole image"),
    (lambda: _naflex_model(), dict(naflex=False),
     r"^naflex=False, but model 'vit' is a NaFlex model"),
    (lambda: _naflex_model(), dict(max_num_patches=0),
     r"^max_num_patches must be a positive integer, got 0"),
])
def test_what_naflex_predict_cannot_do_is_named(photos, build, kwargs, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.classify(build(), photos[0], **kwargs)


def test_predict_command_refuses_a_bad_budget_in_one_line(keras_file, photos, capsys):
    _, path = keras_file
    assert cli.main(["predict", "--from", path, photos[0], "--max-num-patches", "0"]) == 2
    assert capsys.readouterr().err == (
        "keras-vit predict: error: --max-num-patches must be 1 or more, got 0: pass the tokens "
        "each image may take (SigLIP 2's default: 256).\n")


def test_predict_from_a_run_folder_takes_its_labels_and_sigmoid(keras_file, photos, tmp_path):
    """A run trained with the sigmoid loss and evaluated with a central crop: NaFlex takes
    its labels and its activation, and no crop."""
    from keras_vit.training.config import TrainConfig

    model, path = keras_file
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.keras").write_bytes(Path(path).read_bytes())
    config = TrainConfig(optimization=dict(loss="sigmoid"), evaluation=dict(crop_fraction=0.875))
    (run / "config.json").write_text(json.dumps(config.to_dict()))
    (run / "labels.txt").write_text("\n".join(LABELS) + "\n")
    folder, _, pixels = photos
    results = _predict("--from", str(run), folder, "--top-k", "3")
    _, logits = _expected(model, pixels, BUDGET)
    assert [[top["label"] for top in r["top_k"]] for r in results] == [
        [LABELS[i] for i in row] for row in np.argsort(-logits, axis=-1, kind="stable")]
    sigmoid = 1 / (1 + np.exp(-logits.astype("float64")))
    np.testing.assert_allclose(_probabilities(results), sigmoid, rtol=0, atol=2e-6)
