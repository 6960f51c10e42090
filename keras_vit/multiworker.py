"""Keras 3 `model.fit` under `tf.distribute.MultiWorkerMirroredStrategy` (TensorFlow-only).

Stock Keras 3 `fit` fails with several workers (keras-team/keras#20585) at two points,
which `MultiWorkerModel` overrides; `BackupAndRestore` lets only the chief write the
shared backup, as TensorFlow's multi-worker guide asks.
"""

import os
import shutil

import keras
import tensorflow as tf


def in_multi_worker_mode(strategy):
    """Whether `strategy` is a `MultiWorkerMirroredStrategy` spanning several workers.

    Example:

    >>> in_multi_worker_mode(tf.distribute.get_strategy())
    False
    """
    return isinstance(
        strategy, tf.distribute.MultiWorkerMirroredStrategy
    ) and strategy.extended._in_multi_worker_mode()


def is_chief(strategy):
    """Whether this worker writes checkpoints: the chief, or worker 0 without a chief.

    Example:

    >>> is_chief(tf.distribute.get_strategy())
    True
    """
    return strategy.extended.should_checkpoint


def write_directory(directory, strategy):
    """Where this worker writes what belongs in `directory`.

    The chief writes to `directory`; every other worker to its own `workertemp_{id}`
    folder beside it, to delete after writing. All workers must run a save, since
    reading distributed variables (e.g. metrics) takes part in collective ops.

    Example:

    >>> write_directory("/tmp/run/backup", tf.distribute.get_strategy())
    '/tmp/run/backup'
    """
    if is_chief(strategy):
        return directory
    task_id = strategy.cluster_resolver.task_id
    return os.path.join(os.path.dirname(directory), f"workertemp_{task_id}")


def _local(value, strategy):
    if isinstance(value, tf.distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiWorkerModel(keras.Model):
    """A `keras.Model` whose `fit`/`evaluate` work under `MultiWorkerMirroredStrategy`.

    Build it from a functional model's graph; it shares that model's layers and weights.
    On one worker it behaves exactly as `keras.Model`.

    Example:

    >>> import keras_vit
    >>> vit = keras_vit.ViT(image_size=8, patch_size=2, hidden_dim=16, num_layers=1,
    ...                     num_heads=2, mlp_dim=32, num_classes=10, channels=1)
    >>> model = MultiWorkerModel(vit.inputs, vit.outputs)
    >>> model.weights[0] is vit.weights[0]
    True
    """

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Stock Keras averages the first distributed batch across workers eagerly (which
        # fails) only to learn its shapes; this worker's own replica batch has them.
        if iterator is not None and self._distribute_strategy is not None:
            for _, _, it in iterator:
                data_batch = tf.nest.map_structure(
                    lambda v: _local(v, self.distribute_strategy), next(it)
                )
                break
        super()._maybe_symbolic_build(data_batch=data_batch)

    def _replica_logs(self, logs):
        # With several workers Keras reduces each replica's step logs (its own on-read
        # metric values) with `strategy.reduce("MEAN", value, axis=0)`, which fails for
        # scalars. A leading axis of 1 makes it the mean over replicas, a scalar again.
        if not in_multi_worker_mode(self.distribute_strategy):
            return logs
        return {name: value[None] if len(value.shape) == 0 else value for name, value in logs.items()}

    def train_step(self, data):
        return self._replica_logs(super().train_step(data))

    def test_step(self, data):
        return self._replica_logs(super().test_step(data))


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` for several workers sharing `backup_dir`.

    Every worker restores from `backup_dir`; only the chief writes it, the others write
    to a temporary folder (see `write_directory`) that is deleted at once.

    Example:

    >>> backup = BackupAndRestore("/tmp/run/backup")
    """

    def _save_model(self):
        strategy = self.model.distribute_strategy
        if is_chief(strategy):
            return super()._save_model()
        temp = keras.callbacks.BackupAndRestore(write_directory(self.backup_dir, strategy))
        temp.set_model(self.model)
        temp._current_epoch, temp._last_batch_seen = self._current_epoch, self._last_batch_seen
        temp._save_model()
        shutil.rmtree(temp.backup_dir, ignore_errors=True)

    def on_train_end(self, logs=None):
        # Only the chief deletes the shared backup, after every worker is done with it.
        if is_chief(self.model.distribute_strategy):
            super().on_train_end(logs)
