"""One worker of the multi-worker tests: trains a tiny ViT on digits (run as a script).

`python tests/multiworker_job.py OUT_DIR [KILL_AT_EPOCH]` with `TF_CONFIG` set trains
under `MultiWorkerMirroredStrategy`; `train()` without `TF_CONFIG` trains on one device.
"""

import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import multiworker  # noqa: E402

EXAMPLES, BATCH, EPOCHS = 128, 32, 3


class _KillAt(keras.callbacks.Callback):
    """SIGKILLs this process after the second step of epoch `epoch`."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self._epoch == self.epoch and batch == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch


def train(out_dir, kill_at_epoch=None):
    """Trains and writes `weights.npy` and `seen.json` (examples this worker read) to out_dir."""
    strategy = (
        tf.distribute.MultiWorkerMirroredStrategy() if "TF_CONFIG" in os.environ
        else tf.distribute.get_strategy()
    )
    keras.utils.set_random_seed(0)
    digits = load_digits()
    images = (digits.images[:EXAMPLES, :, :, None] / 8.0 - 1.0).astype("float32")
    labels = np.eye(10, dtype="float32")[digits.target[:EXAMPLES]]
    seen = tf.Variable(tf.zeros(EXAMPLES, tf.int64))  # times this process read each example

    def count(index):
        seen.assign_add(tf.one_hot(index, EXAMPLES, dtype=tf.int64))
        return tf.gather(images, index), tf.gather(labels, index)

    def dataset(context):
        indices = tf.data.Dataset.range(EXAMPLES)
        indices = indices.shard(context.num_input_pipelines, context.input_pipeline_id)
        batch = context.get_per_replica_batch_size(BATCH)
        return indices.map(count).batch(batch, drop_remainder=True)

    data = strategy.distribute_datasets_from_function(dataset)
    with strategy.scope():
        vit = keras_vit.ViT(
            image_size=8, patch_size=2, hidden_dim=16, num_layers=1, num_heads=2,
            mlp_dim=32, num_classes=10, channels=1,
        )
        model = multiworker.MultiWorkerModel(vit.inputs, vit.outputs)
        model.compile(
            keras.optimizers.SGD(0.1, momentum=0.9),
            keras.losses.CategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    callbacks = [multiworker.BackupAndRestore(os.path.join(out_dir, "backup"))]
    if kill_at_epoch is not None:
        callbacks.append(_KillAt(kill_at_epoch))
    history = model.fit(data, epochs=EPOCHS, callbacks=callbacks, verbose=0)
    task = strategy.cluster_resolver.task_id if multiworker.in_multi_worker_mode(strategy) else 0
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    np.save(os.path.join(out_dir, f"weights_{task}.npy"), weights)
    with open(os.path.join(out_dir, f"seen_{task}.json"), "w") as f:
        json.dump({"seen": seen.numpy().tolist(), "history": history.history}, f)
    return weights


if __name__ == "__main__":
    train(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
