"""The suite's fixtures and hooks (shared helpers are in helpers.py)."""

import functools
import gc
import http.server
import os
import threading
import types

# helpers imports no ML library, so the variables below are set before any is imported.
from helpers import build_wheel, compute_device, install_wheel, worker_threads

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# On a GPU several test processes share the card (xdist workers, the subprocesses of the
# multi-backend tests): each takes memory as it needs it, instead of JAX's 75% up front
# or TensorFlow's all of it, which would leave the second process none.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
# xdist's workers share the cores: each worker, and the processes its tests start, gets
# its share as OpenMP threads (PyTorch's, OpenBLAS's). OpenMP threads spin while they wait
# for each other, so a PyTorch process with a thread per core beside a busy worker runs
# several times slower than with its share.
_threads = worker_threads(os.environ, os.cpu_count() or 1)
if _threads:
    os.environ["OMP_NUM_THREADS"] = str(_threads)

import keras  # noqa: E402
import pytest  # noqa: E402

# Scripts the distributed tests start in worker processes; importing one runs it.
collect_ignore = ["jax_distribution_job.py", "multiworker_job.py"]
# Fixtures: data, and the scripts that wrote them, run by hand with other code on the path
# (an older keras-vit, or timm, which does not import here).
collect_ignore_glob = ["fixtures/*"]

# Docstring examples (keras_vit/, collected by --doctest-modules) that train a model for
# some epochs: they run in the full suite, not in the quick subset (-m "not slow").
SLOW_EXAMPLES = {"keras_vit.training.engine.train"}


def pytest_report_header(config):
    """Names the Keras backend and the device it computes on (a GPU run shows its card)."""
    return f"keras {keras.__version__}, backend {keras.backend.backend()} on {compute_device()}"


def pytest_configure(config):
    # xdist's --dist loadfile hands out files in the order pytest_collection_modifyitems
    # sorts them (its --no-loadscope-reorder), not most tests first.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    # A conftest's collection hook sees every collected item, those of keras_vit/ too.
    for item in items:
        if item.name in SLOW_EXAMPLES:
            item.add_marker(pytest.mark.slow)
    # The files that hold slow tests first, each file's tests kept together and in order:
    # the two workers (-n 2 --dist loadfile) take the long files while the other is still
    # busy, and end on short ones together.
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(autouse=True, scope="module")
def _frozen_heap():
    # Keras runs a full garbage collection each time a layer deletes one of its variables
    # (`Layer.__delattr__`: `quantize`, loading an int8 file), and a full collection, its
    # or Python's own, walks every object of the process: TensorFlow's, JAX's, PyTorch's
    # and transformers' modules, and what the earlier test files left alive. Frozen at
    # each file's start, those are left out of the file's collections; what the file's
    # tests create is still collected.
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _seeded():
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")


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


# --- the built distribution (tests/test_packaging.py, tests/test_journey.py) -----------


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    """The `bin` folder of a venv with the wheel built from this checkout (built once per
    test process)."""
    root = tmp_path_factory.mktemp("installed")
    return install_wheel(build_wheel(root / "dist"), root / "venv")
