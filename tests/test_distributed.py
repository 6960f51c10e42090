"""Multi-worker training (TensorFlow), the XLA train step, JAX keras.distribution."""

import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOB = os.path.join(HERE, "multiworker_job.py")


def _free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _start_cluster(out_dir, kill_at_epoch=None):
    """Starts two workers of `multiworker_job.py` on 127.0.0.1; worker 1 may kill itself."""
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    procs = []
    for index in range(2):
        env = dict(
            os.environ,
            PYTHONPATH=ROOT,
            KERAS_BACKEND="tensorflow",
            TF_CONFIG=json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            ),
        )
        args = [sys.executable, JOB, str(out_dir)]
        if kill_at_epoch is not None and index == 1:
            args.append(str(kill_at_epoch))
        procs.append(
            subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    return procs


def _kill(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate()


def _wait(procs, timeout=240):
    try:
        outputs = [p.communicate(timeout=timeout)[0].decode(errors="replace") for p in procs]
    finally:
        _kill(procs)
    return [p.returncode for p in procs], outputs


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("multiworker")
    codes, outputs = _wait(_start_cluster(out))
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    return out


def _weights(out, task):
    return np.load(os.path.join(out, f"weights_{task}.npy"))


def test_two_workers_match_one_process(cluster_run, tmp_path):
    """Two workers end with identical weights, equal to one process on the same global
    batch; each read its own half of the examples (even indices / odd indices), every
    one of them at least once per epoch (Keras reads ahead once to build the model)."""
    sys.path.insert(0, HERE)
    try:
        import multiworker_job as job
    finally:
        sys.path.remove(HERE)
    if "TF_CONFIG" in os.environ:
        pytest.skip("TF_CONFIG is set in the test environment")
    import keras

    if keras.backend.backend() != "tensorflow":
        pytest.skip("the single-process reference trains with the TensorFlow backend")
    single = job.train(str(tmp_path))
    np.testing.assert_array_equal(_weights(cluster_run, 0), _weights(cluster_run, 1))
    np.testing.assert_allclose(_weights(cluster_run, 0), single, atol=1e-5)
    reference = json.load(open(tmp_path / "seen_0.json"))
    for task in (0, 1):
        record = json.load(open(cluster_run / f"seen_{task}.json"))
        seen = np.array(record["seen"])
        np.testing.assert_array_equal(np.flatnonzero(seen), np.arange(job.EXAMPLES)[task::2])
        assert seen[task::2].min() >= job.EPOCHS
        np.testing.assert_allclose(record["history"]["loss"], reference["history"]["loss"], rtol=1e-5)


def test_killed_worker_resumes_from_backup(cluster_run, tmp_path):
    """Worker 1 SIGKILLs itself in epoch 2 (after the chief's epoch-1 backup); both are
    killed and restarted, resume from the backup and end where the uninterrupted run did."""
    procs = _start_cluster(tmp_path, kill_at_epoch=1)
    try:
        assert procs[1].wait(timeout=240) == -signal.SIGKILL
        assert procs[0].poll() is None  # the chief waits for its peer inside a step
        assert os.path.exists(tmp_path / "backup" / "training_metadata.json")
        assert json.load(open(tmp_path / "backup" / "training_metadata.json"))["epoch"] == 1
    finally:
        _kill(procs)
    codes, outputs = _wait(_start_cluster(tmp_path))
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    for task in (0, 1):
        np.testing.assert_allclose(_weights(tmp_path, task), _weights(cluster_run, task), atol=1e-6)
    assert not os.path.exists(tmp_path / "backup")  # the chief removes it at the end
    assert not any(p.name.startswith("workertemp") for p in tmp_path.iterdir())


def _digits_batches(n=128):
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images[:n, :, :, None] / 8.0 - 1.0).astype("float32")
    return images, np.eye(10, dtype="float32")[digits.target[:n]]


def _fit_losses(jit_compile, policy="float32"):
    import keras

    import keras_vit

    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(
        image_size=8, patch_size=2, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32,
        num_classes=10, channels=1,
    )
    model.compile(
        keras.optimizers.SGD(0.1, momentum=0.9),
        keras.losses.CategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
        steps_per_execution=4,
    )
    images, labels = _digits_batches()
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(16, drop_remainder=True)
    return model.fit(data, epochs=1, verbose=0).history["loss"]


def test_xla_train_step_matches_eager_graph():
    """The step compiled with XLA (static shapes, 4 steps per execution) trains as the
    plain graph does; under mixed_bfloat16 it compiles too and trains to nearby losses."""
    import keras

    if keras.backend.backend() != "tensorflow":
        pytest.skip("tf.function jit_compile is TensorFlow's")
    plain = _fit_losses(jit_compile=False)
    compiled = _fit_losses(jit_compile=True)
    np.testing.assert_allclose(compiled, plain, rtol=1e-4)
    bf16 = _fit_losses(jit_compile=True, policy="mixed_bfloat16")
    np.testing.assert_allclose(bf16, plain, atol=0.05)


@pytest.fixture(scope="module")
def jax_run():
    pytest.importorskip("jax")
    job = subprocess.run(
        [sys.executable, os.path.join(HERE, "jax_distribution_job.py")],
        env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=300,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    return json.loads(job.stdout.strip().splitlines()[-1])


def test_jax_data_and_model_parallel_match_one_device(jax_run):
    """DataParallel over 4 host devices and ModelParallel (2 x 2 mesh) give the loss
    curve of one device."""
    np.testing.assert_allclose(jax_run["data"], jax_run["one"], rtol=1e-5)
    np.testing.assert_allclose(jax_run["model"], jax_run["one"], rtol=1e-5)


def test_jax_model_parallel_places_kernels_as_declared(jax_run):
    """Each attention/MLP kernel is split over the 2-device "model" axis as VIT_LAYOUT
    declares (its local shard is half the kernel along that axis); the rest is replicated."""
    import re

    from keras_vit.jax_distribution import VIT_LAYOUT

    sharded = 0
    for path, placed in jax_run["shardings"].items():
        assert placed["mesh"] == {"batch": 2, "model": 2}
        axes = next((axes for key, axes in VIT_LAYOUT.items() if re.search(key, path)), None)
        if axes is None:
            assert set(placed["spec"]) <= {None} and placed["shard"] == placed["shape"], path
            continue
        sharded += 1
        assert placed["spec"] == list(axes), path
        expected = [n // 2 if a == "model" else n for n, a in zip(placed["shape"], axes)]
        assert placed["shard"] == expected, path
    assert sharded == 2 * len(VIT_LAYOUT)
