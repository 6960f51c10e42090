"""Several JAX processes as one training run: `keras_vit.train` on the JAX backend.

Each process runs the same command; `join` connects them (`jax.distributed`, CPU
collectives through gloo) and checks that they run one config, `make_distribution` gives
the `keras.distribution` the run trains under (data parallel over every device of every
process). Each process reads its share of each global batch (`input_context`); only
process 0 writes the run folder (`is_chief`), the others write their copies of its files
to a private temporary folder (`scratch_path`), and every process resumes from the run
folder. JAX-only: the engine imports this module on the JAX backend alone.
"""

import hashlib
import json
import os
import socket
import tempfile
import time
import zlib

import jax
import keras
import numpy as np

# Before jax.distributed starts, process 0 listens on the coordinator's port + 1 for the
# other processes (`handshake`): JAX itself aborts the process, with no word of which
# process is missing, when one never joins.
JOIN_PORT_OFFSET = 1
# Settings each process has its own value of.
PER_PROCESS = ("distribution.process_id",)
# How process 0's answer to a process that cannot join begins.
RUN_PROCESSES = "The run's processes did not start together:"


class JoinError(RuntimeError):
    """The processes of a run could not start together (one never joined, or their
    settings differ); the message names the processes and what to do."""


class PortTaken(JoinError):
    """Process 0 cannot listen on the coordinator's port + 1."""


def process_settings(distribution):
    """`(coordinator, num_processes, process_id)` from a `DistributionConfig`, each
    defaulting to `$JAX_COORDINATOR_ADDRESS`, `$JAX_NUM_PROCESSES`, `$JAX_PROCESS_ID`;
    `coordinator` None means one process (no `jax.distributed`).

    Example:

    >>> from keras_vit.training.config import DistributionConfig
    >>> process_settings(DistributionConfig(coordinator="10.0.0.1:1234", num_processes=2,
    ...                                     process_id=1))
    ('10.0.0.1:1234', 2, 1)
    """
    coordinator = distribution.coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
    count, index = (
        _environment_int(name) if value is None else value
        for name, value in (("JAX_NUM_PROCESSES", distribution.num_processes),
                            ("JAX_PROCESS_ID", distribution.process_id))
    )
    if coordinator and coordinator != "auto":
        if None in (count, index):
            raise ValueError(
                f"distribution.coordinator {coordinator!r} needs distribution.num_processes and "
                "distribution.process_id (or $JAX_NUM_PROCESSES and $JAX_PROCESS_ID)."
            )
        if not index < count:
            raise ValueError(
                f"distribution.process_id must be below num_processes {count}, got {index}."
            )
        if ":" not in coordinator or not coordinator.rsplit(":", 1)[1].isdigit():
            raise ValueError(
                f"distribution.coordinator must be HOST:PORT (process 0's address), got "
                f"{coordinator!r}."
            )
    return coordinator, count, index


def _environment_int(name):
    text = os.environ.get(name)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"${name} must be an integer, got {text!r}.") from None


def handshake(coordinator, num_processes, process_id, timeout):
    """Waits up to `timeout` seconds until all `num_processes` processes have reached
    process 0 at `coordinator`'s port + 1; raises `JoinError` naming the processes that
    did not, or that disagree on `num_processes`."""
    host, port = coordinator.rsplit(":", 1)
    address = (host, int(port) + JOIN_PORT_OFFSET)
    deadline = time.monotonic() + timeout
    taken = None
    if process_id == 0:
        try:
            return _gather(address, num_processes, deadline, timeout)
        except PortTaken as error:
            # Another process 0 may hold it: joined as the others do, it answers that two
            # processes have process_id 0. Anything else there is another program.
            taken = error
    while True:
        try:
            connection = socket.create_connection(address, timeout=1)
            break
        except OSError:
            if taken is not None:
                raise taken from None
            if time.monotonic() > deadline:
                raise JoinError(
                    f"Process {process_id}: process 0 (the coordinator, {coordinator}) did not "
                    f"answer within {timeout} s; start it with distribution.process_id=0 and "
                    "the same coordinator (distribution.join_timeout waits longer)."
                ) from None
            time.sleep(0.2)
    with connection, connection.makefile("rw") as stream:
        stream.write(json.dumps([process_id, num_processes]) + "\n")
        stream.flush()
        connection.settimeout(max(deadline - time.monotonic(), 0) + 5)
        try:
            answer = stream.readline().strip()
        except OSError:
            answer = ""
    if taken is not None and not answer.startswith(RUN_PROCESSES):
        raise taken
    if answer != "ok":
        raise JoinError(answer or f"Process {process_id}: process 0 ({coordinator}) stopped answering.")


def _gather(address, num_processes, deadline, timeout):
    """Process 0's side of `handshake`: collects the others' hellos, answers each."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind(("", address[1]))
    except OSError as error:
        server.close()
        raise PortTaken(
            f"Process 0 cannot listen on port {address[1]} (the coordinator's port + "
            f"{JOIN_PORT_OFFSET}): {error.strerror}; pick another coordinator port."
        ) from None
    joined, twice, problems = {}, [], []
    with server:
        server.listen(num_processes)
        while len(joined) < num_processes - 1 and time.monotonic() < deadline:
            server.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                connection, _ = server.accept()
            except socket.timeout:
                break
            connection.settimeout(5)
            try:
                index, count = json.loads(connection.makefile().readline())
            except (OSError, ValueError):
                connection.close()
                continue
            if count != num_processes:
                problems.append(
                    f"process {index} has num_processes {count}, process 0 has {num_processes}"
                )
            elif index in joined or index == 0:
                problems.append(
                    f"two processes have process_id {index} (each needs its own process_id)"
                )
                twice.append(connection)
                continue
            elif not 0 < index < num_processes:
                problems.append(f"process_id {index} is out of range")
            joined.setdefault(index, connection)
        missing = [i for i in range(1, num_processes) if i not in joined]
        if missing:
            problems.append(
                f"process{'es' * (len(missing) > 1)} {', '.join(map(str, missing))} of "
                f"{num_processes} did not join within {timeout} s"
            )
        answer = "ok"
        if problems:
            answer = (
                f"{RUN_PROCESSES} {'; '.join(problems)}. Start one "
                "process per id 0..num_processes-1, all with the same coordinator and "
                "num_processes (distribution.join_timeout waits longer)."
            )
        for connection in [*joined.values(), *twice]:
            with connection:
                try:
                    connection.sendall((answer + "\n").encode())
                except OSError:
                    pass
    if problems:
        raise JoinError(answer)


def join(distribution, settings):
    """Connects this process to the run's others, if it has any; a no-op for one.

    `distribution` is the run's `DistributionConfig` (see `process_settings`); with
    `coordinator="auto"` `jax.distributed.initialize()` finds them itself (Slurm, a TPU
    pod slice, Open MPI). `settings` are the run's `(key, value)` settings, which must be
    the same in every process (but `PER_PROCESS`): a mismatch raises `JoinError` naming
    the processes and keys. Call it before JAX computes anything.
    """
    coordinator, count, index = process_settings(distribution)
    if not coordinator:
        return
    if jax.distributed.is_initialized():  # an earlier run in this process joined them
        check_same_settings(settings)
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeout = distribution.join_timeout
    try:
        if coordinator == "auto":
            jax.distributed.initialize(initialization_timeout=timeout)
        else:
            handshake(coordinator, count, index, timeout)
            jax.distributed.initialize(coordinator, count, index, initialization_timeout=timeout)
    except RuntimeError as error:
        if isinstance(error, JoinError):
            raise
        raise JoinError(f"jax.distributed.initialize failed: {' '.join(str(error).split())}") from None
    check_same_settings(settings)


def check_same_settings(settings):
    """Raises `JoinError` unless every process has the same `settings` (`(key, value)`
    pairs, those in `PER_PROCESS` left out), naming the processes and keys that differ."""
    settings = [(k, v) for k, v in settings if k not in PER_PROCESS]
    digests = np.array(
        [zlib.crc32(json.dumps(v, sort_keys=True, default=str).encode()) for _, v in settings],
        dtype=np.uint32,
    )
    from jax.experimental import multihost_utils

    every = np.asarray(multihost_utils.process_allgather(digests))
    differ = {
        index: [settings[k][0] for k in np.flatnonzero(row != every[0])]
        for index, row in enumerate(every)
        if (row != every[0]).any()
    }
    if differ:
        which = "; ".join(f"process {i}: {', '.join(keys)}" for i, keys in differ.items())
        raise JoinError(
            f"Process {jax.process_index()}: the run's processes have different settings "
            f"from process 0's ({which}); start every process with the same recipe and --set."
        )


def barrier(name):
    """Waits until every process has reached `barrier(name)` (no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def make_distribution(strategy="auto"):
    """The run's `keras.distribution` over every device of every process, set as the
    current distribution: `DataParallel` (`strategy="auto"`) or, for `"fsdp"`,
    `keras_vit.training.jax_distribution.FullyShardedDataParallel`. The engine's input
    pipelines shard the data themselves (`input_context`)."""
    from keras_vit.training.config import JAX_STRATEGIES
    from keras_vit.training.jax_distribution import FullyShardedDataParallel

    if strategy not in JAX_STRATEGIES:
        raise ValueError(
            f"On the JAX backend distribution.strategy is one of {JAX_STRATEGIES} (data "
            f"parallel over every device, or that and the weights sharded), got {strategy!r}."
        )
    kind = FullyShardedDataParallel if strategy == "fsdp" else keras.distribution.DataParallel
    distribution = kind(devices=keras.distribution.list_devices(), auto_shard_dataset=False)
    keras.distribution.set_distribution(distribution)
    return distribution


def input_context(eval_examples=0):
    """The `tf.distribute.InputContext` of this process's input pipeline (one per
    process, each with its share of each global batch), or None with one process.

    The evaluation pass must split evenly (`eval_examples`, 0 without one): a process
    with a batch more than the others would wait for them forever.
    """
    if jax.process_count() == 1:
        return None
    if eval_examples % jax.process_count():
        raise ValueError(
            f"The {eval_examples} evaluation examples do not split evenly over "
            f"{jax.process_count()} processes; evaluate a source whose size they divide "
            "(evaluation.source), or set evaluation.enabled=false."
        )
    import tensorflow as tf

    return tf.distribute.InputContext(
        num_input_pipelines=jax.process_count(),
        input_pipeline_id=jax.process_index(),
        num_replicas_in_sync=jax.process_count(),
    )


def is_chief():
    """Whether this process writes the run folder: process 0."""
    return jax.process_index() == 0


def scratch_path(path):
    """Where a process other than 0 writes its copy of the run's file `path`: a folder
    of its own under the system's temporary folder, never the run folder."""
    folder, name = os.path.split(path)
    digest = hashlib.sha1(folder.encode()).hexdigest()[:12]
    return os.path.join(
        tempfile.gettempdir(), f"keras-vit-process-{jax.process_index()}-{os.getpid()}", digest, name
    )


def precision_policy(name):
    """`distribution.precision` resolved on JAX's devices, as
    `keras_vit.training.distribute.precision_policy` does on TensorFlow's."""
    if name != "auto":
        return name
    device = jax.devices()[0]
    if device.platform == "tpu":
        return "mixed_bfloat16"
    if device.platform == "gpu":
        capability = float(getattr(device, "compute_capability", 0) or 0)
        return "mixed_bfloat16" if capability >= 8 else "mixed_float16"
    return "float32"


def describe(distribution):
    """One line naming the distribution, its devices and processes, for logs."""
    devices = distribution.device_mesh.devices.size
    return (
        f"keras.distribution {type(distribution).__name__}, {devices} device"
        f"{'s' * (devices > 1)} in {jax.process_count()} process"
        f"{'es' * (jax.process_count() > 1)} (this is process {jax.process_index()})"
    )
