"""int8 models on the digits demo: Keras' `model.quantize("int8")` and LiteRT files.

One module fixture trains the demo recipe's model (`keras-vit pretrain --recipe demo`,
fewer epochs); the tests compare the top-1 predictions of each int8 form with the float
model's on the 360 test digits, and the float LiteRT file's outputs with Keras'.
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import cli
from keras_vit.data import eval_dataset, load_source
from keras_vit.export.records import TOLERANCE
from keras_vit.export.saved_model import export_saved_model
from keras_vit.export.tflite import export_tflite, run_tflite
from keras_vit.training import runs

pytestmark = pytest.mark.slow
AGREEMENT = 0.99


def _np(x):
    return keras.ops.convert_to_numpy(x)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    arguments = ["--set", "schedule.epochs=5", "--set", "checkpointing.tensorboard=False"]
    assert cli.main(["pretrain", "--recipe", "demo", "--out", str(out), *arguments]) == 0
    model = runs.load_model(str(out))
    (images, labels), = eval_dataset(load_source("digits", "test"), 16, 360, channels=1,
                                     crop_fraction=1.0)
    images = images.numpy()
    logits = _np(model(images, training=False))
    accuracy = float(np.mean(logits.argmax(-1) == labels.numpy().argmax(-1)))
    assert accuracy > 0.7, f"the demo model reached only {accuracy:.3f}: nothing to compare"
    return out, model, images, logits


def _agreement(logits, reference):
    return float(np.mean(np.argmax(logits, -1) == np.argmax(reference, -1)))


def test_keras_int8_quantizes_every_dense_layer_and_agrees(demo_run, tmp_path):
    out, _, images, float_logits = demo_run
    model = runs.load_model(str(out))
    model.quantize("int8")
    dense = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.Dense)]
    assert len(dense) == 2 + 4 * 2  # projection, head, and qkv, output, fc1, fc2 per block
    assert all(layer.quantization_mode == "int8" for layer in dense)
    assert model.get_layer("encoderblock_0").qkv.kernel.dtype == "int8"
    int8_logits = _np(model(images, training=False))
    agreement = _agreement(int8_logits, float_logits)
    print(f"\nKeras int8: top-1 agreement with float {agreement:.4f} on {len(images)} digits")
    assert agreement >= AGREEMENT

    # .keras round trip: the quantized sublayers come back quantized, bit for bit.
    path = tmp_path / "int8.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.get_layer("encoderblock_1").mlp_fc2.quantization_mode == "int8"
    np.testing.assert_array_equal(_np(loaded(images, training=False)), int8_logits)

    # SavedModel: its `logits` signature takes pixels in [0, 255]. Activations are
    # quantized to int8 on the fly, so a float32 rounding of the preprocessing can move
    # one of them by a step: most rows are equal, and the predictions agree.
    export_saved_model(loaded, tmp_path / "int8_savedmodel")
    served = tf.saved_model.load(str(tmp_path / "int8_savedmodel")).signatures["logits"]
    pixels = tf.constant(images * 127.5 + 127.5)
    served_logits = served(images=pixels)["logits"].numpy()
    rows_equal = np.all(np.abs(served_logits - int8_logits) <= 1e-4, axis=-1)
    assert rows_equal.mean() >= 0.9
    assert _agreement(served_logits, float_logits) >= AGREEMENT


def test_tflite_float_matches_keras_and_dynamic_int8_agrees(demo_run, tmp_path, capsys):
    out, model, images, float_logits = demo_run
    float_file, int8_file = tmp_path / "model.tflite", tmp_path / "int8.tflite"
    common = ["export", "--from", str(out), "--format", "tflite"]
    assert cli.main([*common, "--out", str(float_file)]) == 0
    assert cli.main([*common, "--out", str(int8_file), "--quantize", "dynamic-int8"]) == 0
    printed = capsys.readouterr().out
    assert "Checked with the LiteRT interpreter" in printed and "[-1, 1]" in printed

    served = run_tflite(float_file, images)
    np.testing.assert_allclose(served, float_logits, rtol=0, atol=TOLERANCE)
    int8_logits = run_tflite(int8_file, images)
    agreement = _agreement(int8_logits, float_logits)
    ratio = os.path.getsize(int8_file) / os.path.getsize(float_file)
    with capsys.disabled():
        print(f"\nLiteRT dynamic-int8: top-1 agreement with float {agreement:.4f}, "
              f"{os.path.getsize(int8_file)} / {os.path.getsize(float_file)} bytes ({ratio:.3f})")
    assert agreement >= AGREEMENT
    # Int8 are exactly the kernels of 1024 elements or more: the patch projection and
    # the four per block, 95% of the weights. The converter keeps smaller tensors (the
    # head's 640) and those outside matrix products (position table, norms, biases)
    # in float32, with per-channel scales and zero points beside the int8 kernels.
    interpreter = tf.lite.Interpreter(model_path=str(int8_file))
    int8_sizes = sorted(int(np.prod(t["shape"])) for t in interpreter.get_tensor_details()
                        if t["dtype"] == np.int8)
    kernel_sizes = sorted(int(np.prod(v.shape)) for v in model.weights
                          if v.path.endswith("kernel") and np.prod(v.shape) >= 1024)
    assert int8_sizes == kernel_sizes and len(kernel_sizes) == 1 + 4 * 2
    # The rest, the same in both files, is the float32 tensors (13 KB), the graph
    # (~25 KB: 102 ops, 160 tensors, their names and shapes) and 11.5 KB of scales and
    # zero points, which the demo model's 70k parameters do not outweigh: 0.383 here
    # (docs/export.md); 0.430 before the export forms of Dense, softmax and GELU.
    assert ratio < 0.4
    ops_used = {op["op_name"] for op in interpreter._get_ops_details()}
    assert {"FULLY_CONNECTED", "SOFTMAX", "GELU"} <= ops_used and "GATHER" not in ops_used
    # A model of ViT-Ti's width shows the 4x of int8 weights.
    wide = keras_vit.ViT(image_size=16, channels=1, patch_size=4, hidden_dim=192, num_layers=2,
                         num_heads=3, mlp_dim=768, num_classes=10)
    export_tflite(wide, tmp_path / "wide.tflite")
    export_tflite(wide, tmp_path / "wide_int8.tflite", quantize="dynamic-int8")
    wide_ratio = os.path.getsize(tmp_path / "wide_int8.tflite") / os.path.getsize(
        tmp_path / "wide.tflite"
    )
    with capsys.disabled():
        print(f"LiteRT dynamic-int8 at ViT-Ti width: {wide_ratio:.3f} of the float file")
    assert wide_ratio <= 1 / 3
    record = json.loads(open(str(int8_file) + ".json").read())
    assert record["quantize"] == "dynamic-int8" and record["input"]["shape"] == ["batch", 16, 16, 1]
    assert record["crop_fraction"] == 1.0  # the run's eval_crop_fraction
    assert record["metadata"]["train_config"]["model"]["variant"] == "custom"


def test_tflite_export_refuses_a_keras_int8_model(demo_run, tmp_path):
    model = runs.load_model(str(demo_run[0]))
    model.quantize("int8")
    with pytest.raises(ValueError, match="is quantized with model.quantize"):
        export_tflite(model, tmp_path / "model.tflite")
    with pytest.raises(ValueError, match="Unknown quantize 'int4'"):
        export_tflite(demo_run[1], tmp_path / "model.tflite", quantize="int4")
