import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
import types
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# On a GPU several test processes share the card (xdist workers, the subprocesses of the
# multi-backend tests): each takes memory as it needs it, instead of JAX's 75% up front
# or TensorFlow's all of it, which would leave the second process none.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")

import keras  # noqa: E402
import pytest  # noqa: E402

# Scripts the distributed tests start in worker processes; importing one runs it.
collect_ignore = ["jax_distribution_job.py", "multiworker_job.py"]

# Docstring examples (keras_vit/, collected by --doctest-modules) that train a model for
# some epochs: they run in the full suite, not in the quick subset (-m "not slow").
SLOW_EXAMPLES = {"keras_vit.training.engine.train"}


def compute_device():
    """The device the Keras backend computes on: "cpu", or the GPU's name."""
    sys.path.append(str(Path(__file__).resolve().parents[1]))  # after any installed keras_vit
    from bench.contenders import device_name

    return device_name(keras.backend.backend())


def pytest_report_header(config):
    """Names the Keras backend and the device it computes on (a GPU run shows its card)."""
    return f"keras {keras.__version__}, backend {keras.backend.backend()} on {compute_device()}"


def pytest_collection_modifyitems(config, items):
    # A conftest's collection hook sees every collected item, those of keras_vit/ too.
    for item in items:
        if item.name in SLOW_EXAMPLES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _seeded():
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")


def tiny_vit(**overrides):
    """The 2-layer, width-32 ViT on 32x32 images the tests share."""
    import keras_vit

    kwargs = dict(
        image_size=32, patch_size=8, hidden_dim=32, num_layers=2, num_heads=4,
        mlp_dim=64, num_classes=10,
    )
    kwargs.update(overrides)
    return keras_vit.ViT(**kwargs)


def tiny_demo_recipe(folder):
    """A recipe file in `folder` with the demo cut to a few steps per stage (its code path)."""
    recipe = folder / "tiny_demo.py"
    recipe.write_text(
        "import dataclasses\n"
        "from keras_vit.cli import load_recipe\n"
        "demo = load_recipe('demo', attribute='DEMO')\n"
        "tiny = dict(schedule=dict(epochs=1, micro_batches_per_epoch=2, warmup_updates=0),\n"
        "            distribution=dict(jit_compile='off'))\n"
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


class _Bucket(http.server.SimpleHTTPRequestHandler):
    """Serves a folder; `/short/...` announces the whole file but sends half of it."""

    def __init__(self, *args, requests, **kwargs):
        self.requests = requests
        super().__init__(*args, **kwargs)

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.requests.append(self.path)
        if self.path.startswith("/short/"):
            data = open(self.translate_path(self.path), "rb").read()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            return
        super().do_GET()


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """A loopback HTTP server standing in for the weights bucket (through
    KERAS_VIT_WEIGHTS_MIRROR), with a cache of its own; `put(path, model)` saves a model
    there with `save_npz`."""
    root = tmp_path / "bucket"
    root.mkdir()
    requests = []
    handler = functools.partial(_Bucket, requests=requests, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    from keras_vit.weights import download

    monkeypatch.setenv(download.MIRROR_ENV, f"http://127.0.0.1:{server.server_port}/")
    monkeypatch.setenv(download.CACHE_ENV, str(tmp_path / "cache"))

    def put(path, model):
        import keras_vit

        os.makedirs(root / os.path.dirname(path), exist_ok=True)
        keras_vit.save_npz(model, root / path)
        return (root / path).read_bytes()

    def stop():
        server.shutdown()
        server.server_close()

    state = types.SimpleNamespace(root=root, requests=requests, put=put, stop=stop, stopped=False)
    yield state
    stop()


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


# --- the built distribution (tests/test_packaging.py, tests/test_journey.py) -----------

ROOT = Path(__file__).resolve().parent.parent


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


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    """The `bin` folder of a venv with the wheel built from this checkout (built once per
    test process)."""
    root = tmp_path_factory.mktemp("installed")
    return install_wheel(build_wheel(root / "dist"), root / "venv")
