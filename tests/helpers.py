"""What the test modules share: tiny models and recipes, the loopback bucket's entries,
the built distribution, the user's environment, the other-backend runs.

A helper module, not a test module: test modules import it (`from helpers import ...`),
never each other; conftest.py holds the fixtures and hooks.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The layer, model and family tests, run on JAX and PyTorch as well as TensorFlow
# (tests/test_backends_jax.py, tests/test_backends_torch.py; Keras picks its backend once
# per process, so each backend gets a pytest run of its own).
MULTI_BACKEND_TESTS = [
    "tests/test_layers.py", "tests/test_model.py", "tests/test_resnet.py",
    "tests/test_mixed_precision.py", "tests/test_backend_ops.py", "tests/test_dynamic_size.py",
    "tests/test_saved_families.py",
    # The families: the contract (tests/family_contract.py) and their references.
    "tests/test_deit.py", "tests/test_dinov2.py", "tests/test_eva.py", "tests/test_towers.py",
    "tests/test_dinov3.py", "tests/test_naflex.py", "tests/test_naflex_packing.py",
    "tests/test_naflex_timm.py",
    # PyTorch only (skipped elsewhere): the torch.compile'd steps against eager ones, and
    # the layers called without Layer.__call__ against Keras' call.
    "tests/test_torch_compile.py", "tests/test_torch_calls.py",
    # The optimizer whose update PyTorch fuses, against Keras' own.
    "tests/test_optimizers.py",
]


def compute_device():
    """The device the Keras backend computes on: "cpu", or the GPU's name."""
    import keras

    from keras_vit.utils.devices import device_name

    return device_name(keras.backend.backend())


def run_multi_backend_tests(backend):
    """Runs MULTI_BACKEND_TESTS under `backend` in a pytest subprocess; fails with its output.

    Parameter counts depend only on the layers' shape logic, which is backend-independent,
    so the slow count tests of the full-size variants run once, on TensorFlow.
    """
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-m", "not slow or every_backend", "-k", "not parameter_count", *MULTI_BACKEND_TESTS],
        cwd=ROOT, env={**os.environ, "KERAS_BACKEND": backend}, capture_output=True, text=True,
    )
    print(result.stdout[-3000:])
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]


# In a process of its own, in a stateless scope that leaves the variables uninitialised:
# they have shapes but no values, so H/14 counts its 632M parameters without 2.5 GB of
# random weights (which the test worker's allocator would keep once freed). Keras keeps
# such variables on a list of its process, to initialise them at the next scope that
# does, so they must not outlive the process.
_COUNT_PARAMETERS = """
import json, sys
import keras, keras_vit
counts = []
with keras.StatelessScope(initialize_variables=False):
    for args in json.loads(sys.argv[1]):
        counts.append(keras_vit.ViT(**args).count_params())
print(json.dumps(counts))
"""


def parameter_counts(builds):
    """`count_params()` of `keras_vit.ViT(**kwargs)` for each of `builds`, in a child process."""
    result = subprocess.run(
        [sys.executable, "-c", _COUNT_PARAMETERS, json.dumps(builds)],
        capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def tiny_vit(**overrides):
    """The 2-layer, width-32 ViT on 32x32 images the tests share."""
    import keras_vit

    kwargs = dict(
        image_size=32, patch_size=8, hidden_dim=32, num_layers=2, num_heads=4,
        mlp_dim=64, num_classes=10,
    )
    kwargs.update(overrides)
    return keras_vit.ViT(**kwargs)


def tiny_demo_recipe(folder, jit_compile="off"):
    """A recipe file in `folder` with the demo cut to a few steps per stage (its code path),
    its steps compiled as `jit_compile` says (`distribution.jit_compile`)."""
    recipe = folder / "tiny_demo.py"
    recipe.write_text(
        "import dataclasses\n"
        "from keras_vit.cli import load_recipe\n"
        "demo = load_recipe('demo', attribute='DEMO')\n"
        "tiny = dict(schedule=dict(epochs=1, micro_batches_per_epoch=2, warmup_updates=0),\n"
        f"            distribution=dict(jit_compile={jit_compile!r}))\n"
        "DEMO = dataclasses.replace(\n"
        "    demo, pretrain=demo.pretrain.replace(**tiny),\n"
        "    fewshot=dataclasses.replace(demo.fewshot, shots=(1, 5), seeds=2),\n"
        "    finetune=demo.finetune.replace(**tiny))\n"
    )
    return recipe


def randomise_weights(model, seed, scale=0.2):
    """Non-default weights, so that a lost or misplaced tensor shows in the outputs."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(scale=scale, size=v.shape).astype("float32"))
    return rng


def assert_keras_file_round_trip(model, inputs, path):
    """Saving to and loading from a `.keras` file gives identical outputs."""
    import keras
    import numpy as np

    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(inputs)), keras.ops.convert_to_numpy(model(inputs))
    )


def decodes(payload):
    """Whether TensorFlow's decoder reads the file bytes `payload` (the reference the
    start-up check of image folders is held to)."""
    import tensorflow as tf

    try:
        tf.io.decode_image(payload, expand_animations=False)
        return True
    except tf.errors.InvalidArgumentError:
        return False


# The tiny architecture the bucket's checkpoints have (image size 32, 1000 classes).
TINY = dict(patch_size=8, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=64)


def bucket_entry(name, path, **overrides):
    """Registers (replacing) an entry for a tiny model at `path` in the bucket's layout."""
    import keras_vit
    from keras_vit.weights import registry

    fields = dict(
        name=name, url=registry.OFFICIAL_BASE + path, variant=None, image_size=32,
        num_classes=1000, labels="imagenet1k", finetuning="ImageNet-1k", model_args=TINY,
    )
    fields.update(overrides)
    return keras_vit.register_weights(registry.WeightsEntry(**fields), replace=True)


def bucket_model(seed=1):
    """A tiny model of `bucket_entry`'s architecture with random weights."""
    import keras_vit

    model = keras_vit.ViT(image_size=32, num_classes=1000, **TINY)
    randomise_weights(model, seed)
    return model


def doc_pages():
    """The documentation as a user reads it: README.md, then the site's pages in the
    order of `nav` in mkdocs.yml, as `(path relative to ROOT, text)` pairs."""
    import yaml

    def flatten(entries):
        for entry in entries:
            value = entry if isinstance(entry, str) else next(iter(entry.values()))
            if isinstance(value, list):
                yield from flatten(value)
            else:
                yield value

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    paths = ["README.md", *(f"docs/{page}" for page in flatten(nav))]
    return [(path, (ROOT / path).read_text()) for path in paths]


def clean_environment(**extra):
    """The environment of a user's shell: no PYTHONPATH (it would import this checkout)
    and no KERAS_VIT_* setting."""
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("KERAS_VIT_")}
    env.update(extra)
    return env


def worker_threads(environ, cores):
    """The OpenMP threads for the processes of an xdist worker: its share of `cores`
    (`environ`'s PYTEST_XDIST_WORKER_COUNT workers share them), or None outside xdist
    and where `environ` already sets OMP_NUM_THREADS."""
    if "PYTEST_XDIST_WORKER_COUNT" not in environ or "OMP_NUM_THREADS" in environ:
        return None
    return max(1, cores // int(environ["PYTEST_XDIST_WORKER_COUNT"]))


def build_wheel(folder):
    """Builds this checkout's wheel into `folder` from a copy of its sources (setuptools
    leaves `build/` where it builds, and a stale `build/` can end up in a wheel); no
    network: setuptools as installed."""
    source = Path(folder) / "source"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for name in ("keras_vit", "recipes"):
        shutil.copytree(ROOT / name, source / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(folder), str(source)],
        check=True, capture_output=True,
    )
    (wheel,) = Path(folder).glob("*.whl")
    return wheel


def install_wheel(wheel, venv):
    """A fresh venv at `venv` with the wheel installed (its dependencies come from this
    Python's site-packages); returns the venv's `bin` folder."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    bin_dir = Path(venv) / "bin"
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "--no-deps", "-q",
                    str(wheel)], check=True, capture_output=True, env=clean_environment())
    return bin_dir


TINY_RUN = dict(
    model=dict(
        variant="custom", image_size=8, channels=1,
        kwargs=dict(patch_size=2, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32),
    ),
    data=dict(batch_size=32, inception_crop=False, random_flip=False),
    optimization=dict(weight_decay=0.1),
    schedule=dict(learning_rate=3e-3, warmup_updates=2),
    checkpointing=dict(tensorboard=False),
    distribution=dict(jit_compile="off"),
    evaluation=dict(enabled=False),
)


def tiny_run(**sections):
    """`TINY_RUN` with keys of its sections changed (`schedule=dict(epochs=3)`)."""
    return {
        name: {**TINY_RUN.get(name, {}), **keys} if isinstance(keys, dict) else keys
        for name, keys in {**TINY_RUN, **sections}.items()
    }


RESUMABLE = """
import json, os, signal, sys
import keras
from keras_vit.training.engine import TrainConfig, train

class KillAt(keras.callbacks.Callback):
    def __init__(self, epoch, step):
        super().__init__()
        self.at = (epoch, step)
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch + 1) == self.at:
            os.kill(os.getpid(), signal.SIGKILL)

config = TrainConfig.from_dict(json.loads(sys.argv[1])).replace(out=sys.argv[2])
kill = [KillAt(*map(int, sys.argv[3].split(":")))] if len(sys.argv) > 3 else []
train(config, callbacks=kill, verbose=0)
"""


COMMAND = """
import os, signal, sys
import keras
from keras_vit import cli
from keras_vit.training import engine

after = int(os.environ.get("KILL_AFTER_BATCH", 0))

class KillAfterBatch(keras.callbacks.Callback):
    count = 0
    def on_train_batch_end(self, batch, logs=None):
        KillAfterBatch.count += 1
        if KillAfterBatch.count == after:
            os.kill(os.getpid(), signal.SIGKILL)

if after:
    train = engine.train
    engine.train = lambda config, **kw: train(config, callbacks=[KillAfterBatch()], **kw)
sys.exit(cli.main(sys.argv[1:]))
"""


# vit_jax models_test.py, num_classes=1000 at 224 px.
OFFICIAL_COUNTS = {
    "Ti/16": 5_717_416,
    "S/16": 22_050_664,
    "S/32": 22_878_952,
    "B/16": 86_567_656,
    "B/32": 88_224_232,
    "B/8": 86_576_872,
    "L/16": 304_326_632,
    "L/32": 306_535_400,
    "H/14": 632_045_800,
}


# vit_jax models_test.py, num_classes=1000 at 224 px.
OFFICIAL_HYBRID_COUNTS = {
    "R+Ti/16": 6_337_704,
    "R26+S/32": 36_431_912,
    "R26+B/32": 101_383_976,
    "R50+B/16": 98_659_112,
    "R50+L/32": 328_994_856,
}


def jpeg(seed, mode="RGB", size=(24, 20)):
    """A JPEG written by PIL (`mode` "CMYK" writes a CMYK JPEG, as Photoshop does)."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def bad_sos(payload):
    """`payload` with its scan header damaged as found: the spectral end (Se) and the
    first component's Huffman tables (0x0F: none defined). libjpeg prints "Invalid SOS
    parameters for sequential JPEG", then fails; every marker is still in place."""
    damaged = bytearray(payload)
    sos = damaged.index(b"\xff\xda")
    length = int.from_bytes(damaged[sos + 2:sos + 4], "big")
    damaged[sos + 2 + length - 2] = 0x20
    damaged[sos + 6] = 0x0F
    return bytes(damaged)
