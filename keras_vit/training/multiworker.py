"""Keras 3 `model.fit` under `tf.distribute.MultiWorkerMirroredStrategy` (TensorFlow-only).

Stock Keras 3 `fit` fails with several workers (keras-team/keras#20585) at two points,
which `MultiWorkerModel` overrides (the engine's `keras_vit.training.engine.TrainingModel` is
one); it also makes gradient clipping act on the gradient summed over all replicas. Every worker runs the same program, and only the chief may write shared files:
`write_path` and `chief_writes` say where each worker writes, as TensorFlow's
multi-worker guide prescribes.
"""

import contextlib
import os

import keras
import tensorflow as tf

from keras_vit.utils import keras_compat
from keras_vit.utils.serialization import serializable


# Other workers write their copies of the run's files into `workertemp_{task_id}`.
WORKER_TEMP = "workertemp_"


def in_multi_worker_mode(strategy):
    """Whether `strategy` is a `MultiWorkerMirroredStrategy` spanning several workers.

    Example:

    >>> in_multi_worker_mode(tf.distribute.get_strategy())
    False
    """
    return isinstance(
        strategy, tf.distribute.MultiWorkerMirroredStrategy
    ) and keras_compat.in_multi_worker_mode(strategy)


def on_jax(strategy):
    """Whether `strategy` is a `keras.distribution` (the JAX backend: see
    `keras_vit.training.jax_processes`) rather than a `tf.distribute` strategy.

    Example:

    >>> on_jax(tf.distribute.get_strategy())
    False
    """
    return isinstance(strategy, (keras.distribution.DataParallel, keras.distribution.ModelParallel))


def model_strategy(model):
    """The strategy `model` trains under: its `tf.distribute` strategy, or on JAX the
    current `keras.distribution` (None without one)."""
    return getattr(model, "distribute_strategy", None) or keras.distribution.distribution()


def is_chief(strategy=None):
    """Whether this worker writes the run's files: the chief, or worker 0 without one.

    True for every single-worker strategy (default: the current one). With a
    `keras.distribution` (JAX), whether this is process 0.

    Example:

    >>> is_chief(tf.distribute.get_strategy())
    True
    """
    if on_jax(strategy):
        from keras_vit.training.jax_processes import is_chief as is_process_0

        return is_process_0()
    strategy = strategy or tf.distribute.get_strategy()
    return strategy.extended.should_checkpoint


def write_path(path, strategy=None):
    """Where this worker writes the file or folder `path`.

    The chief writes `path` itself; any other worker writes the same name inside a
    `workertemp_{task_id}` folder beside it, which it deletes when done (see
    `chief_writes`); a JAX process other than 0 writes in a temporary folder of its own
    (`keras_vit.training.jax_processes.scratch_path`). Every worker must take part in a save: reading distributed state
    (such as metrics) runs collective ops across the workers.

    Example:

    >>> write_path("/tmp/run/model.keras", tf.distribute.get_strategy())
    '/tmp/run/model.keras'
    """
    strategy = strategy or tf.distribute.get_strategy()
    if is_chief(strategy):
        return path
    if on_jax(strategy):
        from keras_vit.training.jax_processes import scratch_path

        target = scratch_path(path)
        tf.io.gfile.makedirs(os.path.dirname(target))
        return target
    folder, name = os.path.split(path)
    temp = os.path.join(folder, f"{WORKER_TEMP}{strategy.cluster_resolver.task_id}")
    tf.io.gfile.makedirs(temp)
    return os.path.join(temp, name)


@contextlib.contextmanager
def chief_writes(path, strategy=None):
    """Yields `write_path(path)`; on workers other than the chief, deletes it afterwards.

    Example:

    >>> import tempfile
    >>> with chief_writes(os.path.join(tempfile.mkdtemp(), "notes.txt")) as target:
    ...     with open(target, "w") as f:
    ...         _ = f.write("written by the chief only")
    """
    target = write_path(path, strategy)
    try:
        yield target
    finally:
        if target != path and tf.io.gfile.exists(os.path.dirname(target)):
            tf.io.gfile.rmtree(os.path.dirname(target))


def _local(value, strategy):
    if isinstance(value, tf.distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


def clip_summed_gradients(optimizer):
    """Makes `optimizer` clip the gradient summed over replicas, as on one device.

    Under a `tf.distribute` strategy Keras clips each replica's share of the gradient
    before summing them, so with several replicas a clipped run trains differently
    from one device on the same global batch. Here the shares are summed first, the
    sum is clipped, and each replica passes on its `1/replicas` part (the optimizer then
    sums those parts). Costs one more all-reduce per step, only with clipping on.

    Example:

    >>> optimizer = clip_summed_gradients(keras.optimizers.Adam(global_clipnorm=1.0))
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
    if not (inner.clipnorm or inner.global_clipnorm or inner.clipvalue):
        return optimizer
    clip = keras_compat.clip_gradients_function(inner)

    def clip_sum(grads):
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return clip(grads)
        summed = iter(context.all_reduce("SUM", [g for g in grads if g is not None]))
        clipped = clip([None if g is None else next(summed) for g in grads])
        replicas = context.num_replicas_in_sync
        return [None if g is None else g / replicas for g in clipped]

    keras_compat.set_clip_gradients_function(inner, clip_sum)
    return optimizer


class MultiWorkerFit(keras_compat.SymbolicBuildHook):
    """What makes `fit`/`evaluate` work under `MultiWorkerMirroredStrategy` (a
    `keras.Model` mixin; `MultiWorkerModel` is the ready-made model).

    On one device a model with it behaves exactly as without; on several, its optimizer
    clips the summed gradient (`clip_summed_gradients`). A mixin rather than a
    `keras.Model` subclass: a functional subclass (built with inputs and outputs) has
    Keras rewrite the `keras.Model` in its bases to `Functional`, which must not reach a
    class that subclassed models share.

    Example:

    >>> issubclass(MultiWorkerModel, MultiWorkerFit)
    True
    """

    def compile(self, optimizer="rmsprop", *args, **kwargs):
        super().compile(optimizer, *args, **kwargs)
        if self.optimizer is not None:
            clip_summed_gradients(self.optimizer)

    def symbolic_build_batch(self, iterator):
        # Stock Keras averages the first distributed batch across workers eagerly (which
        # fails) only to learn its shapes; this worker's own replica batch has them.
        if keras_compat.built_strategy(self) is None:
            return None
        for _, _, it in iterator:
            return tf.nest.map_structure(lambda v: _local(v, self.distribute_strategy), next(it))

    def _replica_logs(self, logs):
        # With several workers Keras reduces each replica's step logs (its own on-read
        # metric values) with `strategy.reduce("MEAN", value, axis=0)`, which fails for
        # scalars. A leading axis of 1 makes it the mean over replicas, a scalar again.
        if not in_multi_worker_mode(model_strategy(self)):
            return logs
        return {name: value[None] if len(value.shape) == 0 else value for name, value in logs.items()}

    # On JAX (`(state, data)` in, `(logs, state)` out) the steps are Keras' own.
    def train_step(self, *args):
        if len(args) > 1:
            return super().train_step(*args)
        return self._replica_logs(super().train_step(*args))

    def test_step(self, *args):
        if len(args) > 1:
            return super().test_step(*args)
        return self._replica_logs(super().test_step(*args))


@serializable
class MultiWorkerModel(MultiWorkerFit, keras.Model):
    """A `keras.Model` whose `fit`/`evaluate` work under `MultiWorkerMirroredStrategy`.

    Build it from a functional model's graph; it shares that model's layers and weights.

    Example:

    >>> import keras_vit
    >>> vit = keras_vit.ViT(image_size=8, patch_size=2, hidden_dim=16, num_layers=1,
    ...                     num_heads=2, mlp_dim=32, num_classes=10, channels=1)
    >>> model = MultiWorkerModel(vit.inputs, vit.outputs)
    >>> model.weights[0] is vit.weights[0]
    True
    """
