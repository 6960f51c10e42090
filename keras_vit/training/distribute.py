"""`tf.distribute` strategies, XLA and mixed precision for training (TensorFlow-only)."""

import logging
import os
import shutil

import tensorflow as tf

from keras_vit.utils.checks import check_choice

logger = logging.getLogger("keras_vit")

STRATEGIES = ("auto", "tpu", "mirrored", "multiworker", "cpu")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")


def _tpu_present():
    # Checked without a TPUClusterResolver, which would query the GCE metadata server.
    return bool(os.environ.get("TPU_NAME")) or os.path.exists("/dev/accel0")


def make_strategy(name="auto"):
    """Returns the `tf.distribute.Strategy` called `name`.

    - `"auto"`: a TPU when one is attached, `MirroredStrategy` over several GPUs, else
      `OneDeviceStrategy` on the GPU or the CPU.
    - `"tpu"`: `TPUStrategy` (the TPU named by `$TPU_NAME`, or the local TPU VM).
    - `"mirrored"`: `MirroredStrategy` over all GPUs, or over all logical CPU devices
      when there is no GPU.
    - `"multiworker"`: `MultiWorkerMirroredStrategy` over the cluster `cluster_resolver()`
      finds (`$TF_CONFIG`, or the Slurm job step the process runs in).
    - `"cpu"`: one CPU device.

    Example:

    >>> make_strategy("cpu").num_replicas_in_sync
    1
    """
    check_choice("strategy", name, STRATEGIES)
    if name == "auto":
        if _tpu_present():
            name = "tpu"
        elif len(tf.config.list_logical_devices("GPU")) > 1:
            name = "mirrored"
        else:
            # An explicit strategy (not the default one) also makes Keras build the
            # model's metrics and optimizer before fit's first step.
            device = (tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU"))[0]
            return tf.distribute.OneDeviceStrategy(device.name)
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=os.environ.get("TPU_NAME", "local")
        )
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if name == "mirrored":
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy([d.name for d in devices])
    if name == "multiworker":
        try:
            return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver())
        except RuntimeError as error:
            if "program startup" not in str(error):
                raise
            raise RuntimeError(
                "strategy='multiworker' must be created before TensorFlow runs anything in "
                "this process, but TensorFlow has already started (a Keras layer or "
                "variable was made, e.g. by a recipe at import). Give a recipe's "
                "augmentations in serialized form, dict(class_name=..., config=...), and "
                "build models after `train` has made the strategy."
            ) from None
    return tf.distribute.OneDeviceStrategy("/cpu:0")


def cluster_resolver():
    """The `tf.distribute` cluster resolver for a multi-worker run in this environment.

    `$TF_CONFIG`, when set, describes the cluster (`TFConfigClusterResolver`). Otherwise,
    in a Slurm job step (`srun`: `$SLURM_PROCID` and `$SLURM_STEP_NODELIST` set), each
    task is a worker on its node, at port 8888 and up (`SlurmClusterResolver`); on
    nodes without NVIDIA GPUs the resolver sets no `CUDA_VISIBLE_DEVICES`. Otherwise this
    process is the only worker.

    Example:

    >>> type(cluster_resolver()).__name__  # no TF_CONFIG, no Slurm
    'TFConfigClusterResolver'
    """
    resolvers = tf.distribute.cluster_resolver
    if os.environ.get("TF_CONFIG") or not (
        os.environ.get("SLURM_PROCID") and os.environ.get("SLURM_STEP_NODELIST")
    ):
        return resolvers.TFConfigClusterResolver()
    if os.environ.get("CUDA_VISIBLE_DEVICES") or shutil.which("nvidia-smi"):
        return resolvers.SlurmClusterResolver()
    # TF's resolver hands GPUs out to the tasks of a node (asking nvidia-smi); on CPU
    # nodes each task gets a nominal slot, which only numbers its port.
    slots = int(os.environ.get("SLURM_STEP_NUM_TASKS", 1))
    return resolvers.SlurmClusterResolver(gpus_per_node=slots, gpus_per_task=1, auto_set_gpu=False)


def _device_type(strategy):
    return tf.DeviceSpec.from_string(strategy.extended.worker_devices[0]).device_type


def jit_allowed(strategy):
    """Whether `model.fit` can compile its step with XLA under `strategy`.

    XLA runs everywhere except for a step replicated over several CPU devices
    (MirroredStrategy's cross-device reduction fails under XLA on CPU).

    Example:

    >>> jit_allowed(make_strategy("cpu"))
    True
    """
    return not (strategy.num_replicas_in_sync > 1 and _device_type(strategy) == "CPU")


def micro_batches_per_execution(requested, strategy):
    """The micro-batches `model.fit` runs per call of its training function under
    `strategy`: `requested`, or 1 where Keras cannot run several.

    Keras runs several steps a call in a `tf.while_loop` whose body calls the replicas'
    step inside a `tf.cond`. With several replicas of `MirroredStrategy` or
    `MultiWorkerMirroredStrategy`, that step's all-reduce fails there ("You must feed a
    value for placeholder tensor", keras-team/keras#19246). One step a call computes the
    same updates, so the run goes on at 1 and logs one line saying so.

    Example:

    >>> micro_batches_per_execution(4, make_strategy("cpu"))
    4
    """
    mirrored = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
    if requested > 1 and isinstance(strategy, mirrored) and strategy.num_replicas_in_sync > 1:
        logger.warning(
            "distribution.micro_batches_per_execution %d runs as 1 under %s with %d replicas: "
            "Keras' multi-step loop fails there (keras-team/keras#19246); the updates are the same.",
            requested, type(strategy).__name__, strategy.num_replicas_in_sync,
        )
        return 1
    return requested


def precision_policy(name, strategy):
    """Resolves a precision name to a Keras dtype policy name.

    `"auto"` means `mixed_bfloat16` on TPU, `mixed_bfloat16` on GPUs that compute in
    bfloat16 (compute capability 8.0 and up), `mixed_float16` on older GPUs, and
    `float32` on CPU. The model's head, the loss, the attention logits and softmax and
    the LayerNorm statistics stay float32 in every policy, and under `mixed_float16`
    Keras' `compile` wraps the optimizer in a `LossScaleOptimizer`.

    Example:

    >>> precision_policy("auto", make_strategy("cpu"))
    'float32'
    """
    check_choice("precision", name, PRECISIONS)
    if name != "auto":
        return name
    device_type = _device_type(strategy)
    if device_type == "TPU":
        return "mixed_bfloat16"
    if device_type == "GPU":
        gpus = tf.config.list_physical_devices("GPU")
        capability = tf.config.experimental.get_device_details(gpus[0]).get(
            "compute_capability", (0, 0)
        )
        return "mixed_bfloat16" if tuple(capability) >= (8, 0) else "mixed_float16"
    return "float32"


def describe(strategy):
    """One line naming the strategy and its devices, for logs.

    Example:

    >>> describe(make_strategy("cpu"))
    'OneDeviceStrategy, 1 replica: /job:localhost/replica:0/task:0/device:CPU:0'
    """
    replicas = strategy.num_replicas_in_sync
    devices = ", ".join(strategy.extended.worker_devices)
    return f"{type(strategy).__name__}, {replicas} replica{'s' * (replicas > 1)}: {devices}"
