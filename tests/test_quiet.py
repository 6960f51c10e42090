"""Commands print their own lines only: no TensorFlow log line, cuInit note or warning
meant for developers, on any backend, for a user who set no TF_CPP_MIN_LOG_LEVEL."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT, clean_environment, tiny_demo_recipe, tiny_vit

# TensorFlow's C++ log records (severity and date), their notes, and Python warnings.
NOISE = re.compile(
    r"^[IWEF]\d{4} |absl::InitializeLog|To enable the following instructions|oneDNN"
    r"|cuInit|cuda drivers|DeprecationWarning|FutureWarning|deprecated|TensorFlow Lite"
)


def _python(*args, backend="tensorflow"):
    """`python ARGS` in a fresh process on `backend`, as a user's shell starts it."""
    env = clean_environment(KERAS_BACKEND=backend, PYTHONPATH=str(ROOT))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # tests/conftest.py sets it for this process only
    process = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                             timeout=900)
    assert process.returncode == 0, process.stderr
    return process


def _command(*args, backend="tensorflow"):
    """`keras-vit ARGS` in a fresh process on `backend`."""
    return _python("-m", "keras_vit", *args, backend=backend)


def _noise(process):
    return [line for line in (process.stdout + process.stderr).splitlines()
            if NOISE.search(line)]


@pytest.fixture(scope="module")
def model_and_image(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("quiet")
    tiny_vit().save(folder / "tiny.keras")
    pixels = np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(folder / "img.png")
    return folder / "tiny.keras", folder / "img.png"


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_predict_prints_no_tensorflow_log_line(model_and_image, backend):
    model, image = model_and_image
    process = _command("predict", "--from", str(model), str(image), "--top-k", "2",
                       backend=backend)
    assert process.stdout.splitlines()[0] == str(image)  # it did classify the image
    assert _noise(process) == []


@pytest.fixture(scope="module")
def hf_directory_and_photos(tmp_path_factory):
    """A tiny HF ViT classifier with HF ViT's image processor (PIL bilinear, resample
    2) at 32 px, and scikit-learn's two sample photos (real JPEGs)."""
    from sklearn.datasets import load_sample_images
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    folder = tmp_path_factory.mktemp("hf_vit")
    ViTForImageClassification(ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        image_size=32, patch_size=8, num_labels=3)).save_pretrained(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder, list(load_sample_images().filenames)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_predict_and_weights_run_without_tensorflow_on_jax_and_torch(
        hf_directory_and_photos, backend):
    """`keras-vit predict --weights` decodes and resizes without TensorFlow (PIL and
    NumPy, `keras_vit.data.images`), and `keras-vit weights` needs none: neither imports
    it on JAX or PyTorch."""
    folder, photos = hf_directory_and_photos
    code = (
        "import sys\n"
        "from keras_vit import cli\n"
        f"assert cli.main(['predict', '--weights', {str(folder)!r}, *{photos!r}, "
        "'--top-k', '2']) == 0\n"
        "assert cli.main(['weights', 'vit_base_patch16_224*']) == 0\n"
        "print('tensorflow imported:', 'tensorflow' in sys.modules)\n"
    )
    process = _python("-c", code, backend=backend)
    lines = process.stdout.splitlines()
    assert [line for line in lines if line in photos] == photos  # each photo classified
    assert any(line.startswith("vit_base_patch16_224") for line in lines)
    assert lines[-1] == "tensorflow imported: False"
    assert _noise(process) == []


@pytest.fixture(scope="module")
def run_folder_and_image(model_and_image, tmp_path_factory):
    """An unfinished run of `keras-vit finetune` as its files are laid out
    (`keras_vit.training.runs`): its config.json (trained with the sigmoid loss), its
    labels.txt and one checkpoint, of the tiny ViT whose head starts at zero."""
    from keras_vit.training import runs
    from keras_vit.training.config import TrainConfig

    _, image = model_and_image
    folder = tmp_path_factory.mktemp("run")
    config = TrainConfig(optimization=dict(loss="sigmoid"), out=str(folder))
    (folder / runs.CONFIG).write_text(json.dumps(config.to_dict()))
    (folder / runs.LABELS).write_text("".join(f"colour {i}\n" for i in range(10)))
    (folder / runs.CHECKPOINTS).mkdir()
    tiny_vit().save(folder / runs.CHECKPOINTS / "epoch_0001.keras")
    return folder, image


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_predict_from_a_run_folder_runs_without_tensorflow_on_jax_and_torch(
        run_folder_and_image, backend):
    """`keras-vit predict --from RUN` reads the run's files (config, labels, newest
    checkpoint) without TensorFlow (`keras_vit.utils.paths`): it is not imported and
    prints nothing. The control: the same run copied to TensorFlow's in-memory file
    system (`ram://`, a TensorFlow-only feature, as `gs://` is) makes the same command
    import it."""
    folder, image = run_folder_and_image
    code = (
        "import os, sys\n"
        "from keras_vit import cli\n"
        "from keras_vit.utils import paths\n"
        "from keras_vit.utils.tensorflow_log import tensorflow_log_dropped\n"
        f"assert cli.main(['predict', '--from', {str(folder)!r}, {str(image)!r}, "
        "'--top-k', '2']) == 0\n"
        "print('tensorflow imported:', 'tensorflow' in sys.modules)\n"
        "with tensorflow_log_dropped():\n"
        f"    for root, _, names in os.walk({str(folder)!r}):\n"
        "        paths.makedirs('ram://' + root)\n"
        "        for name in names:\n"
        "            paths.write_bytes('ram://' + os.path.join(root, name),\n"
        "                              paths.read_bytes(os.path.join(root, name)))\n"
        f"assert cli.main(['predict', '--from', 'ram://' + {str(folder)!r}, {str(image)!r}, "
        "'--top-k', '2']) == 0\n"
        "print('tensorflow imported:', 'tensorflow' in sys.modules)\n"
    )
    process = _python("-c", code, backend=backend)
    lines = process.stdout.splitlines()
    # The run's labels, at sigmoid(0) = 0.5 (its loss; softmax would give 1/10 each).
    assert lines[:4] == [str(image), "  0.5000  colour 0", "  0.5000  colour 1",
                         "tensorflow imported: False"]
    # From ram:// too, with the run's labels and loss read there.
    assert lines[4:7] == [str(image), "  0.5000  colour 0", "  0.5000  colour 1"]
    assert lines[-1] == "tensorflow imported: True"
    assert _noise(process) == []


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_weights_prints_no_tensorflow_log_line(backend):
    process = _command("weights", "vit_base_patch16_224*", backend=backend)
    assert "vit_base_patch16_224" in process.stdout
    assert _noise(process) == []


@pytest.mark.parametrize("format", ["onnx", "tflite"])
def test_export_prints_no_warning_or_log_line(model_and_image, tmp_path, format):
    """ONNX: NumPy's FutureWarning from Keras' tf2onnx path; LiteRT: its interpreter's
    note on the XNNPACK delegate, as the export checks the file."""
    model, _ = model_and_image
    out = tmp_path / f"vit.{format}"
    process = _command("export", "--from", str(model), "--format", format, "--out", str(out))
    assert out.is_file()
    assert "max |difference|" in process.stdout  # the file was run and checked
    assert _noise(process) == []


def test_lines_around_tensorflows_are_passed_on_whole():
    """What else the process writes to its standard error, from Python or from C, comes
    through in order while TensorFlow starts in the middle."""
    code = (
        "import os, sys\n"
        "from keras_vit.utils.tensorflow_log import tensorflow_log_dropped\n"
        "with tensorflow_log_dropped():\n"
        "    print('before', file=sys.stderr, flush=True)\n"
        "    import tensorflow as tf\n"
        "    tf.constant(1.0) + 1\n"
        "    os.write(2, b'from C, no newline')\n"
        "print('after', file=sys.stderr)\n"
    )
    process = _python("-c", code)
    assert process.stderr == "before\nfrom C, no newlineafter\n"


def test_a_second_block_drops_the_log_lines_too():
    """The first block's own `TF_CPP_MIN_LOG_LEVEL` is not taken for the user's by the
    next: a script that runs two commands (`cli.main`) and starts TensorFlow in the
    second sees no log line. The user's own setting is left as it was."""
    code = (
        "import os\n"
        "from keras_vit.utils.tensorflow_log import tensorflow_log_dropped\n"
        "with tensorflow_log_dropped():\n"
        "    pass\n"
        "print('after the first:', os.environ.get('TF_CPP_MIN_LOG_LEVEL'))\n"
        "with tensorflow_log_dropped():\n"
        "    import tensorflow as tf\n"
        "    tf.constant(1.0) + 1\n"
        "os.environ['TF_CPP_MIN_LOG_LEVEL'] = '1'\n"
        "with tensorflow_log_dropped():\n"
        "    pass\n"
        "print('the user\\'s:', os.environ.get('TF_CPP_MIN_LOG_LEVEL'))\n"
    )
    process = _python("-c", code)
    assert process.stdout == "after the first: None\nthe user's: 1\n"
    assert process.stderr == ""


def test_a_log_line_written_in_pieces_is_dropped_whole():
    """C's stderr is unbuffered: LiteRT writes `INFO: `, its message and the newline
    in three writes."""
    code = (
        "import os, time\n"
        "from keras_vit.utils.tensorflow_log import tensorflow_log_dropped\n"
        "with tensorflow_log_dropped():\n"
        "    for piece in (b'INFO: ', b'Created TensorFlow Lite XNNPACK delegate for CPU.',\n"
        "                  b'\\n', b'I', b'nput: 3 images\\n'):\n"
        "        os.write(2, piece)\n"
        "        time.sleep(0.2)\n"
    )
    process = _python("-c", code)
    assert process.stderr == "Input: 3 images\n"


def test_the_lines_continuing_a_dropped_record_are_dropped_with_it():
    """Issue 48, item 15: a stray `[[{{node MultiDeviceIteratorGetNextFromShard}}]]`
    line ended successful runs: the tab-indented rest of a TensorFlow status logged as a
    warning. A tab-indented line after another program's line is passed on."""
    code = (
        "import os\n"
        "from keras_vit.utils.tensorflow_log import tensorflow_log_dropped\n"
        "with tensorflow_log_dropped():\n"
        "    os.write(2, b'W0000 00:00:1796448031.455878    1196 local_rendezvous.cc:404] '\n"
        "                b'Local rendezvous is aborting with status: OUT_OF_RANGE: End of '\n"
        "                b'sequence\\n\\t [[{{node MultiDeviceIteratorGetNextFromShard}}]]\\n')\n"
        "    os.write(2, b'Evaluation: accuracy 0.9\\n\\tkept\\n')\n"
    )
    process = _python("-c", code)
    assert process.stderr == "Evaluation: accuracy 0.9\n\tkept\n"


@pytest.mark.slow  # three training stages, cut to a few steps each
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])  # JAX: tf.data starts TensorFlow
def test_demo_prints_no_tensorflow_log_line(tmp_path, backend):
    # A few steps run quickest eagerly on TensorFlow; eager JAX compiles each op instead.
    recipe = tiny_demo_recipe(tmp_path, jit_compile="off" if backend == "tensorflow" else "auto")
    process = _command("demo", "--recipe", str(recipe), "--out", str(tmp_path / "demo"),
                       backend=backend)
    assert "Stage 3/3" in process.stderr
    assert _noise(process) == []
    assert os.path.isfile(tmp_path / "demo" / "summary.json")
