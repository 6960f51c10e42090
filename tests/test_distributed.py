"""Beyond one machine: multi-worker training through the engine (TensorFlow), the TPU
settings on CPU (XLA, bfloat16, a graph-only input pipeline), JAX keras.distribution."""

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

pytestmark = pytest.mark.slow  # several worker processes per test

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


def _start_cluster(out, kill_at=None):
    """Starts two workers of `multiworker_job.py` on 127.0.0.1; worker 1 may kill itself."""
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    procs = []
    for index in range(2):
        env = dict(
            os.environ,
            PYTHONPATH=ROOT,
            KERAS_BACKEND="tensorflow",
            # Four workers share the cores with this process: one op thread each.
            TF_NUM_INTRAOP_THREADS="1",
            TF_NUM_INTEROP_THREADS="1",
            TF_CONFIG=json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            ),
        )
        args = [sys.executable, JOB, str(out)]
        if kill_at is not None and index == 1:
            args.append(kill_at)
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


def _job():
    sys.path.insert(0, HERE)
    try:
        import multiworker_job
    finally:
        sys.path.remove(HERE)
    return multiworker_job


def _record(out, task=0):
    return dict(np.load(os.path.join(out, f"worker_{task}.npz")))


@pytest.fixture(scope="module")
def tensorflow_backend():
    import keras

    if keras.backend.backend() != "tensorflow":
        pytest.skip("the training engine runs on the TensorFlow backend")


def _uninterrupted(out):
    codes, outputs = _wait(_start_cluster(out))
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)


def _killed_and_restarted(out):
    """Worker 1 SIGKILLs itself after step 3 of epoch 2 (the chief backs up after step 2);
    then both are killed and restarted from the chief's backup."""
    from keras_vit.training.callbacks import TrainingBackup

    procs = _start_cluster(out, kill_at="1,2")
    try:
        assert procs[1].wait(timeout=240) == -signal.SIGKILL, _wait(procs)[1][1][-3000:]
        # The chief's write may still be landing (it is atomic): wait for it.
        while TrainingBackup.saved_position(str(out / "backup")) != (1, 2):
            assert procs[0].poll() is None, "the chief stopped before its step-2 backup"
            time.sleep(0.2)
    finally:
        _kill(procs)
    codes, outputs = _wait(_start_cluster(out))
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)


def _tpu_settings_job(out):
    job = subprocess.run(
        [sys.executable, JOB, str(out), "tpu"],
        env=dict(os.environ, PYTHONPATH=ROOT, KERAS_BACKEND="tensorflow"),
        capture_output=True, text=True, timeout=600,
    )
    assert job.returncode == 0, job.stderr[-3000:]


def _jax_job():
    job = subprocess.run(
        [sys.executable, os.path.join(HERE, "jax_distribution_job.py")],
        env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=600,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    return json.loads(job.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def background(tmp_path_factory):
    """Starts this module's subprocesses at once (much of their time is imports and
    waiting for each other): the two-worker runs, uninterrupted and killed + restarted,
    the run with TPU settings and the JAX job. Their results come as futures."""
    if "TF_CONFIG" in os.environ:
        pytest.skip("TF_CONFIG is set in the test environment")
    uninterrupted = tmp_path_factory.mktemp("multiworker")
    killed = tmp_path_factory.mktemp("killed")
    tpu = tmp_path_factory.mktemp("tpu_settings")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        yield dict(
            uninterrupted=(uninterrupted, pool.submit(_uninterrupted, uninterrupted)),
            killed=(killed, pool.submit(_killed_and_restarted, killed)),
            tpu=(tpu, pool.submit(_tpu_settings_job, tpu)),
            jax=pool.submit(_jax_job),
        )


@pytest.fixture(scope="module")
def cluster_run(tensorflow_backend, background):
    """The demo recipe on two workers, uninterrupted."""
    out, future = background["uninterrupted"]
    future.result()
    return out


@pytest.fixture(scope="module")
def single_run(tensorflow_backend, background, tmp_path_factory):
    """The same run in this process, on one device (while the clusters run)."""
    out = tmp_path_factory.mktemp("single")
    _job().run(str(out), "cpu")
    return out


def test_tpu_train_step_compiles_with_xla_and_bfloat16(single_run, background):
    """The demo run with the TPU settings (jit_compile on, 2 steps per execution, static
    shapes) trains on CPU as the plain graph did; under mixed_bfloat16 it compiles too
    and trains to nearby losses. (jit_compile=True fails rather than fall back when a
    step cannot be compiled.)"""
    out, future = background["tpu"]
    future.result()
    reference = _record(single_run)
    for precision, atol in zip(_job().TPU_PRECISIONS, (1e-5, 0.02)):
        run = _record(out / precision)
        metrics = json.loads((out / precision / "metrics.json").read_text())
        assert metrics["jit_compile"] is True and metrics["precision"] == precision
        assert str(run["compute_dtype"]) == precision.replace("mixed_b", "b")
        np.testing.assert_array_equal(run["images"], reference["images"])  # the same data
        np.testing.assert_allclose(run["loss"], reference["loss"], atol=atol)


def test_multiworker_cluster_from_tf_config_or_slurm(monkeypatch):
    """TF_CONFIG wins; otherwise an srun job step gives one worker per Slurm task (no
    nvidia-smi here: no GPUs are handed out); otherwise this process is the only worker."""
    from keras_vit.training.distribute import cluster_resolver

    for name in list(os.environ):
        if name.startswith("SLURM_") or name in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi
    assert cluster_resolver().cluster_spec().as_dict() == {}
    slurm = dict(
        SLURM_PROCID="3", SLURM_STEP_NUM_TASKS="4", SLURM_STEP_NODELIST="node[07-08]",
        SLURM_STEP_TASKS_PER_NODE="2(x2)",
    )
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    resolver = cluster_resolver()
    assert type(resolver).__name__ == "SlurmClusterResolver"
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["node07:8888", "node07:8889", "node08:8888", "node08:8889"]
    }
    assert resolver.get_task_info() == ("worker", 3)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    tf_config = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    resolver = cluster_resolver()
    assert resolver.cluster_spec().as_dict() == tf_config["cluster"]
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)


def test_multiworker_after_tensorflow_started_is_a_clear_error(monkeypatch):
    """TensorFlow refuses to set up collectives once it runs; the user is told why."""
    from keras_vit.training.distribute import make_strategy

    tf.constant(1.0)  # TensorFlow has started in this process
    tf_config = {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    with pytest.raises(RuntimeError, match="strategy='multiworker' must be created before"):
        make_strategy("multiworker")


PYTHON_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}


def _ops(dataset):
    """Every op type in a tf.data pipeline's graph, its functions' bodies included."""
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(dataset._as_serialized_graph().numpy())
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return {node.op for node in nodes}


def test_input_pipeline_is_graph_only_with_static_shapes(tensorflow_backend):
    """The demo recipe's training stream (and one with every augmentation) has static
    shapes and no Python function in its graph, as a TPU needs; a pipeline with
    tf.py_function shows that the inspection finds one."""
    from keras_vit import data as vit_data

    demo = _job().config("unused", "tpu")
    source = vit_data.load_source(demo.data.source)
    streams = [
        vit_data.train_dataset(
            source, demo.model.image_size, demo.data.batch_size, channels=demo.model.channels,
            inception_crop=demo.data.inception_crop, random_flip=demo.data.random_flip,
        ),
        vit_data.train_dataset(source, 16, 8, channels=1, augment="medium2", cutmix=1.0),
    ]
    for stream in streams:
        assert all(spec.shape.is_fully_defined() for spec in stream.element_spec)
        assert "MapDataset" in _ops(stream) or "ParallelMapDatasetV2" in _ops(stream)
        assert not _ops(stream) & PYTHON_OPS
    with_python = streams[0].map(lambda x, y: (tf.py_function(tf.identity, [x], tf.float32), y))
    assert _ops(with_python) & PYTHON_OPS


def test_two_workers_match_one_process(cluster_run, single_run):
    """Both workers finish with identical weights, equal (1e-5) to one process on the same
    global batch and seed; worker k is input pipeline k of 2 and its batches are the
    elements k, k + 2, ... of the one process's batches: each saw half the data."""
    workers = [_record(cluster_run, task) for task in (0, 1)]
    single = _record(single_run)
    np.testing.assert_array_equal(workers[0]["weights"], workers[1]["weights"])
    np.testing.assert_allclose(workers[0]["weights"], single["weights"], atol=1e-5)
    for record in workers:
        np.testing.assert_allclose(record["loss"], single["loss"], rtol=1e-5)
    assert single["images"].shape[:2] == (_job().STEPS, 32)
    for task, record in enumerate(workers):
        assert list(record["pipeline"]) == [task, 2]
        np.testing.assert_array_equal(record["images"], single["images"][:, task::2])
        np.testing.assert_array_equal(record["labels"], single["labels"][:, task::2])
    # Only the chief wrote the run folder; the other worker's temporary files are gone.
    assert (cluster_run / "model.keras").exists() and (cluster_run / "config.json").exists()
    assert not list(cluster_run.glob("**/workertemp_*"))
    assert sorted(p.name for p in (cluster_run / "checkpoints").iterdir()) == [
        "epoch_0001.keras", "epoch_0002.keras"
    ]


def test_killed_worker_resumes_from_backup(cluster_run, background):
    """Worker 1 is SIGKILLed in epoch 2 after the chief's mid-epoch backup; both are
    restarted, resume from that backup and end with the uninterrupted run's weights."""
    from keras_vit.training.callbacks import TrainingBackup

    out, future = background["killed"]
    future.result()
    uninterrupted = _record(cluster_run)
    for task in (0, 1):
        resumed = _record(out, task)
        np.testing.assert_allclose(resumed["weights"], uninterrupted["weights"], atol=1e-6)
        np.testing.assert_allclose(resumed["loss"][-1], uninterrupted["loss"][-1], rtol=1e-5)
    assert not (out / "backup" / TrainingBackup.FILE).exists()  # the chief removed it
    assert not list(out.glob("**/workertemp_*"))


@pytest.fixture(scope="module")
def jax_run(background):
    pytest.importorskip("jax")
    return background["jax"].result()


def test_jax_data_and_model_parallel_match_one_device(jax_run):
    """DataParallel over 4 host devices and ModelParallel (2 x 2 mesh) give the loss
    curve of one device."""
    np.testing.assert_allclose(jax_run["data"], jax_run["one"], rtol=1e-5)
    np.testing.assert_allclose(jax_run["model"], jax_run["one"], rtol=1e-5)


def test_jax_model_parallel_places_kernels_as_declared(jax_run):
    """Each attention/MLP kernel is split over the 2-device "model" axis as VIT_LAYOUT
    declares (its local shard is half the kernel along that axis); the rest is replicated."""
    import re

    from keras_vit.training.jax_distribution import VIT_LAYOUT

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
