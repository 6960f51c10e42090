"""Callbacks of the training engine: full-state backups for resuming, model checkpoints."""

import io
import logging
import math
import os

import keras
import numpy as np
import tensorflow as tf

from keras_vit.training.multiworker import chief_writes, is_chief
from keras_vit.utils import keras_compat
from keras_vit.utils.checks import check_positive_int

logger = logging.getLogger("keras_vit")


def _finite(logs):
    loss = (logs or {}).get("loss")
    return loss is None or math.isfinite(float(loss))


def _write_atomically(path, data):
    """Writes bytes so that a reader sees the old file or the new one, never a part."""
    tmp = f"{path}.tmp"
    with tf.io.gfile.GFile(tmp, "wb") as f:
        f.write(data)
    tf.io.gfile.rename(tmp, path, overwrite=True)


class TrainingBackup(keras.callbacks.Callback):
    """Backs up the whole training state so that a run killed at any moment resumes.

    Like `keras.callbacks.BackupAndRestore`, with three differences that make a resumed
    run end with exactly the weights of an uninterrupted one:

    - the backup holds every variable: model weights, optimizer slots and step count
      (gradient accumulators too), the layers' random-seed states and the running
      metrics, in one file that is replaced atomically (a kill while writing leaves the
      previous backup intact);
    - it records the position as `(epoch, step)`; on restore the model passes over the
      `step` batches of the epoch that were already done (`TrainingModel.pass_steps`)
      instead of training on them again; the input pipeline must start at the saved
      position too (`keras_vit.data.train_dataset(start_batch=...)`, see
      `saved_position`);
    - a state whose loss is not finite is never backed up, and the backup is kept
      when training stops early, so a NaN leaves the last good state on disk.

    With several workers (`MultiWorkerMirroredStrategy`) every worker restores from
    `directory`, which only the chief writes (see `keras_vit.training.multiworker.write_path`).

    Args:
        directory: where `state.npz` lives (only this callback may write there).
        every: also back up every `every` steps inside an epoch (always at epoch ends).

    Example:

    >>> backup = TrainingBackup("/tmp/run/backup", every=100)
    >>> TrainingBackup.saved_position("/tmp/nowhere")
    (0, 0)
    """

    FILE = "state.npz"

    def __init__(self, directory, every=None):
        super().__init__()
        if every is not None:
            check_positive_int("Backup interval", every)
        self.directory = directory
        self.every = every
        self.path = os.path.join(directory, self.FILE)
        self._epoch = 0
        self._metrics_to_restore = None

    @classmethod
    def saved_position(cls, directory):
        """`(epoch, step)` of the backup in `directory`, `(0, 0)` when there is none."""
        path = os.path.join(directory, cls.FILE)
        if not tf.io.gfile.exists(path):
            return 0, 0
        with tf.io.gfile.GFile(path, "rb") as f:
            state = np.load(io.BytesIO(f.read()))
            return int(state["epoch"]), int(state["step"])

    def _groups(self):
        model = self.model
        return {
            "model": model.variables,
            "optimizer": model.optimizer.variables if model.optimizer else [],
            "metrics": [v for metric in model.metrics for v in metric.variables],
        }

    def _save(self, epoch, step):
        arrays = {"epoch": np.array(epoch), "step": np.array(step)}
        for group, variables in self._groups().items():
            for i, variable in enumerate(variables):
                arrays[f"{group}/{i}"] = variable.numpy()  # Aggregated over replicas.
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        with chief_writes(self.path, self.model.distribute_strategy) as path:
            tf.io.gfile.makedirs(os.path.dirname(path))
            _write_atomically(path, buffer.getvalue())

    def on_train_begin(self, logs=None):
        if not tf.io.gfile.exists(self.path):
            return
        model = self.model
        if model.optimizer is not None and not model.optimizer.built:
            with model.distribute_strategy.scope():
                model.optimizer.build(model.trainable_variables)
        with tf.io.gfile.GFile(self.path, "rb") as f:
            state = dict(np.load(io.BytesIO(f.read())))
        groups = self._groups()
        saved = {
            group: [state[f"{group}/{i}"] for i in range(sum(k.startswith(f"{group}/") for k in state))]
            for group in groups
        }
        for group in ("model", "optimizer"):
            variables = groups[group]
            if [a.shape for a in saved[group]] != [tuple(v.shape) for v in variables]:
                raise ValueError(
                    f"The backup {self.path} does not match this run: its {group} state has "
                    f"{len(saved[group])} variables, this run's has {len(variables)} (or their "
                    "shapes differ). Resume with the configuration that wrote it, or delete it."
                )
        for group in ("model", "optimizer"):
            for variable, value in zip(groups[group], saved[group]):
                variable.assign(value)
        epoch, step = int(state["epoch"]), int(state["step"])
        keras_compat.set_initial_epoch(model, epoch)
        self._epoch = epoch
        if step:
            model.pass_steps(step)
            if [a.shape for a in saved["metrics"]] == [tuple(v.shape) for v in groups["metrics"]]:
                self._metrics_to_restore = saved["metrics"]
            else:  # Metrics not built yet (a model outside a strategy scope).
                logger.warning("Epoch %d's running metrics restart at the resumed step.", epoch + 1)
        logger.info("Resumed from %s at epoch %d, step %d.", self.path, epoch + 1, step)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if self._metrics_to_restore is not None:
            # fit() resets the metrics before each epoch: put back the epoch's running means.
            for variable, value in zip(self._groups()["metrics"], self._metrics_to_restore):
                variable.assign(value)
            self._metrics_to_restore = None

    def on_train_batch_end(self, batch, logs=None):
        step = batch + 1
        steps = self.params.get("steps")
        if self.every and step % self.every == 0 and step != steps and _finite(logs):
            self._save(self._epoch, step)

    def on_epoch_end(self, epoch, logs=None):
        if _finite(logs):
            self._save(epoch + 1, 0)

    def on_train_end(self, logs=None):
        finished = self._epoch + 1 >= self.params.get("epochs", 0) and _finite(logs)
        if not is_chief(self.model.distribute_strategy):
            return
        if finished and not self.model.stop_training and tf.io.gfile.exists(self.path):
            tf.io.gfile.remove(self.path)


class EpochCheckpoints(keras.callbacks.Callback):
    """Saves a model as `epoch_NNNN.keras` after each epoch whose loss is finite.

    Keeps the newest `keep` files. The saved model is `model` (the network itself,
    without optimizer state), which may differ from the model being fit (e.g. a
    `TrainingModel` around it). With several workers only the chief keeps the files.

    Example:

    >>> import keras_vit
    >>> vit = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                     num_heads=4, mlp_dim=64, num_classes=10)
    >>> checkpoints = EpochCheckpoints(vit, "/tmp/run/checkpoints", keep=2)
    """

    def __init__(self, model, directory, keep=3):
        super().__init__()
        check_positive_int("keep", keep)
        self.network = model
        self.directory = directory
        self.keep = int(keep)
        self.saved = []

    def on_train_begin(self, logs=None):
        # A resumed run also prunes the checkpoints written before the restart.
        if tf.io.gfile.isdir(self.directory):
            self.saved = sorted(
                os.path.join(self.directory, name)
                for name in tf.io.gfile.listdir(self.directory)
                if name.startswith("epoch_") and name.endswith(".keras")
            )

    def on_epoch_end(self, epoch, logs=None):
        if not _finite(logs):
            logger.warning(
                "Loss is not finite after epoch %d: no checkpoint written; the last good one "
                "is %s.", epoch + 1, self.saved[-1] if self.saved else "none",
            )
            return
        path = os.path.join(self.directory, f"epoch_{epoch + 1:04d}.keras")
        strategy = self.model.distribute_strategy
        with chief_writes(path, strategy) as target:
            folder = os.path.dirname(target)
            tf.io.gfile.makedirs(folder)
            tmp = os.path.join(folder, f"partial_{epoch + 1:04d}.keras")
            self.network.save(tmp)
            tf.io.gfile.rename(tmp, target, overwrite=True)
        if not is_chief(strategy):
            return
        self.saved.append(path)
        while len(self.saved) > self.keep:
            old = self.saved.pop(0)
            if tf.io.gfile.exists(old):
                tf.io.gfile.remove(old)
