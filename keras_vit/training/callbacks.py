"""Callbacks of the training engine: full-state backups for resuming, model checkpoints,
each epoch's metrics (metrics.csv, TensorBoard). Every file is written atomically
(`keras_vit.utils.files`).

TensorFlow (`multiworker`, TensorBoard's writer) is imported when a callback runs in
`fit`, not with the module: reading a run folder (`keras_vit.training.runs`, e.g. for
`keras-vit predict --from RUN`) needs none on JAX or PyTorch."""

import csv
import io
import logging
import math
import os
import shutil
import tempfile

import keras
import numpy as np

from keras_vit.utils import interrupts, keras_compat, model_files, paths
from keras_vit.utils.checks import check_positive_int
from keras_vit.utils.csv_rows import write_rows
from keras_vit.utils.files import atomic_path, atomic_write

logger = logging.getLogger("keras_vit")


def _multiworker():
    """`keras_vit.training.multiworker` (which imports TensorFlow), for `fit` only."""
    from keras_vit.training import multiworker

    return multiworker


def not_finite(logs):
    """The names of the metrics in `logs` (the loss, `val_loss`, accuracies, ...) that
    are NaN or infinite, sorted: a state with any is never backed up or checkpointed,
    and a run ending with any is not finished.

    Example:

    >>> not_finite({"loss": 0.5, "val_loss": float("nan"), "val_top1": 0.1})
    ['val_loss']
    """
    return sorted(k for k, v in (logs or {}).items() if not math.isfinite(float(v)))


def one_host_model(model):
    """`model`, or on JAX with weights split over processes a copy holding each whole
    (`keras_vit.utils.sharded_state.one_host_copy`), to save as a `.keras` file.
    Every process must call it."""
    if keras.backend.backend() != "jax":
        return model
    from keras_vit.utils.sharded_state import one_host_copy

    return one_host_copy(model)


class TerminateOnNotFinite(keras.callbacks.TerminateOnNaN):
    """`keras.callbacks.TerminateOnNaN` (a batch's loss), and any epoch metric, the
    evaluation's too (see `not_finite`)."""

    def on_epoch_end(self, epoch, logs=None):
        if not_finite(logs):
            self.model.stop_training = True


class TrainingBackup(keras.callbacks.Callback):
    """Backs up the whole training state so that a run killed at any moment resumes.

    Like `keras.callbacks.BackupAndRestore`, with three differences that make a resumed
    run end with exactly the weights of an uninterrupted one:

    - the backup holds every variable: model weights, optimizer slots and step count
      (gradient accumulators too), the layers' random-seed states and the running
      metrics, in one file that is replaced atomically (a kill while writing leaves the
      previous backup intact); where the weights are split over devices (FSDP, model-
      parallel layouts on JAX) the arrays go, sharded, to a folder `sharded_EEEE_SSSSSSSS`
      that each process writes its shards of through Orbax (`sharded_state`) before the
      file that names it replaces the previous one;
    - it records the position as `(epoch, step)`; on restore the model passes over the
      `step` batches of the epoch that were already done (`TrainingModel.pass_steps`)
      instead of training on them again; the input pipeline must start at the saved
      position too (`keras_vit.data.train_dataset(start_batch=...)`, see
      `saved_position`);
    - a state whose loss is not finite is never backed up, and the backup outlives
      `fit`: the engine removes it (`remove`) only once the run's final files are in
      place, so a NaN (in the loss or any metric, evaluation's too), or a kill at any
      moment, leaves the last good state on disk.

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
    # Folders of sharded states (`keras_vit.utils.sharded_state`), which the state
    # file names when the model's weights are split over devices.
    SHARDED = "sharded_"

    def __init__(self, directory, every=None):
        super().__init__()
        if every is not None:
            check_positive_int("Backup interval", every)
        self.directory = directory
        self.every = every
        self.path = os.path.join(directory, self.FILE)
        self._epoch = 0
        self._passed = 0
        self._metrics_to_restore = None

    @classmethod
    def saved_position(cls, directory):
        """`(epoch, step)` of the backup in `directory`, `(0, 0)` when there is none."""
        path = os.path.join(directory, cls.FILE)
        if not paths.exists(path):
            return 0, 0
        state = np.load(io.BytesIO(paths.read_bytes(path)))
        return int(state["epoch"]), int(state["step"])

    def _groups(self):
        model = self.model
        return {
            "model": model.variables,
            "optimizer": model.optimizer.variables if model.optimizer else [],
            "metrics": [v for metric in model.metrics for v in metric.variables],
        }

    def _sharded_path(self, name):
        return os.path.join(self.directory, name)

    def _save(self, epoch, step):
        arrays = {"epoch": np.array(epoch), "step": np.array(step)}
        groups = self._groups()
        sharded = split_over_devices(self.model.variables)
        if sharded:
            from keras_vit.utils import sharded_state

            # Each process writes its own shards of the state (Orbax) first; the state
            # file written after it names that folder, so a kill before leaves the
            # previous state in force.
            name = f"{self.SHARDED}{epoch:04d}_{step:08d}"
            sharded_state.save(
                self._sharded_path(name), {g: [v.value for v in vs] for g, vs in groups.items()}
            )
            arrays["sharded"] = np.array(name)
        else:
            for group, variables in groups.items():
                for i, variable in enumerate(variables):
                    arrays[f"{group}/{i}"] = variable.numpy()  # Aggregated over replicas.
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        multiworker = _multiworker()
        strategy = multiworker.model_strategy(self.model)
        with multiworker.chief_writes(self.path, strategy) as path:
            paths.makedirs(os.path.dirname(path))
            atomic_write(path, buffer.getvalue())
        if multiworker.is_chief(strategy):  # the sharded states no state file names any more
            current = str(arrays["sharded"]) if sharded else None
            for old in paths.listdir(self.directory):
                old = old.rstrip("/")
                if old.startswith(self.SHARDED) and old != current:
                    paths.rmtree(os.path.join(self.directory, old))

    def _read(self, state, groups):
        """`{group: [array]}` of the backup whose state file holds `state`."""
        if "sharded" not in state:
            return {
                group: [state[f"{group}/{i}"] for i in range(sum(k.startswith(f"{group}/") for k in state))]
                for group in groups
            }
        import jax

        from keras_vit.utils import sharded_state

        path = self._sharded_path(str(state["sharded"]))
        saved = sharded_state.metadata(path)
        like = {g: [v.value for v in vs] for g, vs in groups.items()}
        for group, variables in groups.items():
            if [m.shape for m in saved[group]] != [tuple(v.shape) for v in variables]:
                if group != "metrics":  # refused by the caller, which reads only the shapes
                    return saved
                # Running metrics not built yet: restored whole, to be left aside.
                device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
                like[group] = [
                    jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device) for m in saved[group]
                ]
        return sharded_state.restore(path, like)

    def on_train_begin(self, logs=None):
        if not paths.exists(self.path):
            return
        model = self.model
        if model.optimizer is not None and not model.optimizer.built:
            with _multiworker().model_strategy(model).scope():
                model.optimizer.build(model.trainable_variables)
        state = dict(np.load(io.BytesIO(paths.read_bytes(self.path))))
        groups = self._groups()
        saved = self._read(state, groups)
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
            self._passed = step
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
        if step <= self._passed:  # passed over on resuming: the backup holds this state
            return
        self._passed = 0
        if self.every and step % self.every == 0 and step != steps and not not_finite(logs):
            self._save(self._epoch, step)

    def on_epoch_end(self, epoch, logs=None):
        if not not_finite(logs):
            self._save(epoch + 1, 0)

    @classmethod
    def remove(cls, directory):
        """Deletes the backup in `directory`, and the folder once empty (the run it
        belongs to is complete)."""
        path = os.path.join(directory, cls.FILE)
        if paths.exists(path):
            paths.remove(path)
        if paths.isdir(directory):
            for name in paths.listdir(directory):
                if name.startswith(cls.SHARDED):  # no state file names it any more
                    paths.rmtree(os.path.join(directory, name.rstrip("/")))
        if paths.isdir(directory) and not paths.listdir(directory):
            paths.rmtree(directory)


class EpochCheckpoints(keras.callbacks.Callback):
    """Saves a model as `epoch_NNNN.keras` after each epoch whose metrics are finite.

    Keeps the newest `keep` checkpoints. The saved model is `model` (the network itself,
    without optimizer state), which may differ from the model being fit (e.g. a
    `TrainingModel` around it). With several workers only the chief keeps the files.
    Where the weights are split over devices (FSDP, model-parallel layouts on JAX) the
    checkpoint is a folder `epoch_NNNN.orbax` instead, which each process writes its
    shards of through Orbax (`sharded_state.save_model`), nothing gathered;
    `keras_vit.utils.model_files.read_keras` reads either kind into one host.

    Example:

    >>> import keras_vit
    >>> vit = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                     num_heads=4, mlp_dim=64, num_classes=10)
    >>> checkpoints = EpochCheckpoints(vit, "/tmp/run/checkpoints", keep=2)
    >>> EpochCheckpoints.find("/tmp/no-such-run/checkpoints")
    []
    """

    def __init__(self, model, directory, keep=3):
        super().__init__()
        check_positive_int("keep", keep)
        self.network = model
        self.directory = directory
        self.keep = int(keep)
        self.saved = []

    @classmethod
    def find(cls, directory):
        """The checkpoints in `directory`, oldest epoch first."""
        return sorted(p for p in _epoch_entries(directory) if p.endswith(model_files.SUFFIXES))

    def on_train_begin(self, logs=None):
        # A resumed run also prunes the checkpoints written before the restart, and the
        # folders a kill left part-written (Orbax's temporary ones) or part-deleted.
        self.saved = self.find(self.directory)
        multiworker = _multiworker()
        if multiworker.is_chief(multiworker.model_strategy(self.model)):
            for path in set(_epoch_entries(self.directory)) - set(self.saved):
                _remove(path)

    def on_epoch_end(self, epoch, logs=None):
        if not_finite(logs):
            logger.warning(
                "%s not finite after epoch %d: no checkpoint written; the last good one "
                "is %s.", ", ".join(not_finite(logs)), epoch + 1,
                self.saved[-1] if self.saved else "none",
            )
            return
        sharded = split_over_devices(self.network.variables)
        name = f"epoch_{epoch + 1:04d}"
        path = os.path.join(self.directory, name + (model_files.SHARDED if sharded else ".keras"))
        multiworker = _multiworker()
        strategy = multiworker.model_strategy(self.model)
        if sharded:  # every process writes its shards into the run folder itself
            from keras_vit.utils import sharded_state

            paths.makedirs(self.directory)
            sharded_state.save_model(path, self.network)
        else:
            with multiworker.chief_writes(path, strategy) as target:
                paths.makedirs(os.path.dirname(target))
                with atomic_path(target) as temporary:
                    one_host_model(self.network).save(temporary)
        if not multiworker.is_chief(strategy):
            return
        # A rerun of an epoch replaces its checkpoint (of either kind, should the
        # resumed run shard otherwise): count it once.
        self.saved = sorted(set(self.saved) | {path})
        for old in [p for p in self.saved if os.path.basename(p).startswith(name) and p != path]:
            self.saved.remove(old)
            _remove(old)
        while len(self.saved) > self.keep:
            _remove(self.saved.pop(0))


def split_over_devices(variables):
    """Whether any of `variables` is split over devices (FSDP, model-parallel layouts),
    which only the JAX backend does here: their checkpoints are then written sharded
    (`keras_vit.utils.sharded_state`)."""
    if keras.backend.backend() != "jax":
        return False
    from keras_vit.utils import sharded_state

    return sharded_state.is_sharded(variables)


def _epoch_entries(directory):
    """Every `epoch_*` file and folder in `directory`: checkpoints and leftovers."""
    if not paths.isdir(directory):
        return []
    names = (name.rstrip("/") for name in paths.listdir(directory))
    return [os.path.join(directory, n) for n in names if n.startswith("epoch_")]


def _remove(path):
    """Deletes the checkpoint file or folder `path`, if there. A folder is renamed first
    (atomic), so that a kill while deleting leaves no part of it under a checkpoint's name."""
    if paths.isdir(path):
        # (Not in a bucket, where a rename copies.)
        if path.endswith(model_files.SUFFIXES) and "://" not in path:
            paths.rename(path, path + ".removed")
            path += ".removed"
        paths.rmtree(path)
    elif paths.exists(path):
        paths.remove(path)


class EpochLog(keras.callbacks.Callback):
    """Writes each epoch's metrics exactly once: a row of `metrics.csv` and TensorBoard scalars.

    A run that resumes at epoch `initial_epoch` repeats the epochs from there, so the rows
    and scalars of those epochs that a killed run wrote are replaced, not added to:

    - `metrics.csv` (`epoch` from 0, then the logs' keys, as `keras.callbacks.CSVLogger`
      writes it) is rewritten whole after each epoch: the rows of the epochs before
      `initial_epoch` already in the file, then this run's;
    - TensorBoard gets one events file per epoch (and per split: `train/` and, for the
      `val_` logs, `validation/`, tags `epoch_NAME` as `keras.callbacks.TensorBoard`
      writes them), `events.out.tfevents.NNNNNN.keras-vit`, which a rerun of the epoch
      replaces.

    Both are written before the epoch's backup (`TrainingBackup` comes after it in the
    callbacks), so no epoch the backup counts as done can lack them. `history()` gives
    the whole run's history, across restarts.

    Args:
        csv_path: the `metrics.csv` to write.
        logs_dir: the TensorBoard folder, or None for none.
        initial_epoch: the epoch this run starts at (0 for a new run).

    Example:

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> log = EpochLog(os.path.join(folder, "metrics.csv"))
    >>> log.on_train_begin()
    >>> log.on_epoch_end(0, {"loss": 2.5, "val_loss": 2.75})
    >>> open(os.path.join(folder, "metrics.csv")).read().splitlines()
    ['epoch,loss,val_loss', '0,2.5,2.75']
    >>> log.history()
    {'loss': [2.5], 'val_loss': [2.75]}
    """

    def __init__(self, csv_path, logs_dir=None, initial_epoch=0):
        super().__init__()
        self.csv_path = csv_path
        self.logs_dir = logs_dir
        self.initial_epoch = int(initial_epoch)
        self.rows = []

    def on_train_begin(self, logs=None):
        self.rows = [row for row in read_metrics_csv(self.csv_path) if row["epoch"] < self.initial_epoch]

    def on_epoch_end(self, epoch, logs=None):
        values = {key: float(value) for key, value in (logs or {}).items()}
        self.rows = [row for row in self.rows if row["epoch"] < epoch] + [dict(epoch=epoch, **values)]
        keys = sorted({key for row in self.rows for key in row} - {"epoch"})
        text = io.StringIO()
        write_rows(text, [["epoch", *keys]] + [
            [row["epoch"], *(row.get(k, "") for k in keys)] for row in self.rows
        ])
        atomic_write(self.csv_path, text.getvalue())
        if self.logs_dir:
            splits = dict(
                train={k: v for k, v in values.items() if not k.startswith("val_")},
                validation={k[4:]: v for k, v in values.items() if k.startswith("val_")},
            )
            for split, scalars in splits.items():
                if scalars:
                    _write_scalars(os.path.join(self.logs_dir, split), epoch, scalars)

    def history(self):
        """`{metric: [value per epoch]}` over every epoch logged, as `History.history`."""
        keys = sorted({key for row in self.rows for key in row} - {"epoch"})
        return {key: [row.get(key, math.nan) for row in self.rows] for key in keys}


def read_metrics_csv(path):
    """The rows of a run's `metrics.csv` as dicts (`epoch` an int, values floats); [] if none.

    Example:

    >>> read_metrics_csv("/tmp/no-such-run/metrics.csv")
    []
    """
    if not paths.exists(path):
        return []
    rows = list(csv.DictReader(io.StringIO(paths.read_text(path))))
    return [
        {key: int(value) if key == "epoch" else float(value) for key, value in row.items() if value != ""}
        for row in rows
    ]


def _write_scalars(folder, epoch, scalars):
    """`scalars` at step `epoch` as one events file of its own, replacing any earlier one."""
    import tensorflow as tf  # TensorBoard's events format

    scratch = tempfile.mkdtemp(prefix="keras_vit_events_")
    try:
        writer = tf.summary.create_file_writer(scratch)
        with writer.as_default():
            for name, value in sorted(scalars.items()):
                tf.summary.scalar(f"epoch_{name}", value, step=epoch)
        writer.close()
        (name,) = os.listdir(scratch)
        with open(os.path.join(scratch, name), "rb") as f:
            data = f.read()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    paths.makedirs(folder)
    atomic_write(os.path.join(folder, f"events.out.tfevents.{epoch:06d}.keras-vit"), data)


class StopOnSignal(keras.callbacks.Callback):
    """Ends `fit` at the next batch with the `KeyboardInterrupt` of a SIGINT or SIGTERM
    received inside `keras_vit.utils.interrupts.catching_signals` that library code lost
    (as `keras-vit` commands run; elsewhere it does nothing).

    Example:

    >>> import os, signal
    >>> from keras_vit.utils import interrupts
    >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    >>> model.compile(loss="mse")
    >>> with interrupts.catching_signals():
    ...     try:  # the signal's own exception, lost as some library code loses it
    ...         os.kill(os.getpid(), signal.SIGINT)
    ...     except KeyboardInterrupt:
    ...         pass
    ...     try:
    ...         model.fit(np.zeros((8, 1)), np.zeros(8), batch_size=2, verbose=0,
    ...                   callbacks=[StopOnSignal()])
    ...     except KeyboardInterrupt:
    ...         print("fit stopped")
    fit stopped
    """

    def on_train_batch_end(self, batch, logs=None):
        interrupts.raise_if_signalled()
