"""Files written by keras-vit 0.1.0 (commit 25b1e66) still load and give the same outputs.

The fixtures and the script that wrote them are described in tests/fixtures/README.md.
"""

import json
from pathlib import Path

import keras
import numpy as np

import keras_vit

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_npz_written_by_v0_1_0_loads_with_the_same_logits():
    saved = np.load(FIXTURES / "vit_v0_1_0_npz_io.npz")
    model = keras_vit.ViT(**json.loads(str(saved["vit_kwargs"])))
    before = keras.ops.convert_to_numpy(model(saved["images"]))
    assert not np.allclose(before, saved["logits"], atol=1e-3)  # only the load can match

    report = keras_vit.load_pretrained(model, FIXTURES / "vit_v0_1_0_npz.npz")
    assert not (report.missing or report.unexpected or report.mismatched or report.messages)
    logits = keras.ops.convert_to_numpy(model(saved["images"]))
    # The same float32 computation: equal up to the order of summation.
    np.testing.assert_allclose(logits, saved["logits"], rtol=1e-6, atol=1e-6)


def test_keras_file_loads_when_keras_is_imported_after_keras_vit():
    """`import keras_vit` no longer imports Keras (the CLI starts without TensorFlow), yet a
    script that imports Keras afterwards and only calls `load_model` finds the layers."""
    script = (
        "import sys, keras_vit\n"
        "assert 'keras' not in sys.modules\n"
        "import keras\n"
        f"model = keras.saving.load_model({str(FIXTURES / 'run_v0_1_0' / 'model.keras')!r})\n"
        "print(type(model).__name__)\n"
    )
    assert _run(script).split()[-1] == "VisionTransformer"


def test_a_submodule_imported_first_finds_its_names_and_the_layers_register():
    """`from keras_vit.models.vit import ...` as a script's first line: vit.py imports
    Keras, whose import used to register every layer module at once, and one of them
    imported vit.py while it was half-made (bench/models.py failed so)."""
    script = (
        "from keras_vit.models.vit import parse_variant\n"
        "import keras, keras_vit\n"
        "keras_vit.ViT  # the first use of the package imports and registers the rest\n"
        f"model = keras.saving.load_model({str(FIXTURES / 'run_v0_1_0' / 'model.keras')!r})\n"
        "print(parse_variant('Ti/16')['hidden_dim'], type(model).__name__)\n"
    )
    assert _run(script).split()[-2:] == ["192", "VisionTransformer"]


def _run(script):
    """The standard output of `script` run in a fresh Python process, which must succeed."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout
