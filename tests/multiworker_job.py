"""One worker of the multi-worker tests: the demo recipe through the training engine.

`python tests/multiworker_job.py OUT [KILL_AT]` (with `TF_CONFIG` set by the test) trains
`recipes/demo.py`, made tiny by `SETTINGS`, with `strategy="multiworker"`; `KILL_AT`
("epoch,batch") makes this worker SIGKILL itself after that step. `run(out, "cpu")`
trains the same on one device; `multiworker_job.py OUT tpu` runs `run_tpu_settings`. Each run writes `OUT/worker_{task}.npz`: its final
weights, its loss history, the compute dtype, which input pipeline it was (`[id, of]`)
and the run's batches as its pipeline yields them (read from a second iterator).
"""

import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_vit import cli, training  # noqa: E402
from keras_vit import data as vit_data  # noqa: E402
from keras_vit.training.config import apply_overrides  # noqa: E402

SETTINGS = [
    "model.kwargs.hidden_dim=16", "model.kwargs.num_layers=1", "model.kwargs.num_heads=2",
    "model.kwargs.mlp_dim=32", "data.batch_size=32", "schedule.epochs=2",
    "schedule.micro_batches_per_epoch=4", "schedule.warmup_updates=2",
    "checkpointing.backup_every_micro_batches=2", "checkpointing.tensorboard=false",
    "distribution.jit_compile=off", "evaluation.enabled=false",
    # One process runs two micro-batches a call; the workers one a call (see
    # `keras_vit.training.distribute.micro_batches_per_execution`), with the same updates.
    "distribution.micro_batches_per_execution=2",
]
STEPS = 8  # epochs * micro_batches_per_epoch
TPU_PRECISIONS = ("float32", "mixed_bfloat16")


def config(out, strategy):
    """The demo recipe with `SETTINGS`, as `keras-vit pretrain --recipe demo --set ...`."""
    recipe = apply_overrides(cli.load_recipe("demo"), SETTINGS)
    return recipe.replace(out=str(out), distribution=dict(strategy=strategy)).validate()


class _KillAt(keras.callbacks.Callback):
    def __init__(self, epoch, batch):
        super().__init__()
        self.at = (epoch, batch)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            os.kill(os.getpid(), signal.SIGKILL)


def _probing(train_dataset, probe):
    """`train_dataset` that also records its pipeline and its first `STEPS` batches."""

    def make(*args, input_context=None, **kwargs):
        dataset = train_dataset(*args, input_context=input_context, **kwargs)
        batches = list(dataset.take(STEPS).as_numpy_iterator())
        probe.update(
            images=np.stack([images for images, _ in batches]),
            labels=np.stack([labels for _, labels in batches]),
            pipeline=[input_context.input_pipeline_id, input_context.num_input_pipelines]
            if input_context else [0, 1],
        )
        return dataset

    return make


def run(out, strategy, kill_at=None, **changes):
    """Trains (`changes`: more settings, as `TrainConfig.replace` takes them); returns what it writes to
    `out/worker_{task}.npz` (see the module doc)."""
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
    probe, train_dataset = {}, vit_data.train_dataset
    vit_data.train_dataset = _probing(train_dataset, probe)
    try:
        callbacks = [_KillAt(*kill_at)] if kill_at else []
        settings = config(out, strategy).replace(**changes)
        result = training.train(settings, callbacks=callbacks, verbose=0)
    finally:
        vit_data.train_dataset = train_dataset
    record = dict(
        probe,
        weights=np.concatenate([w.ravel() for w in result.model.get_weights()]),
        loss=np.array(result.history["loss"]),
        compute_dtype=np.array(result.model.get_layer("encoderblock_0").compute_dtype),
    )
    np.savez(os.path.join(out, f"worker_{task}.npz"), **record)
    return record


def run_tpu_settings(out):
    """The run on one device with a TPU's settings: XLA, 2 steps per execution, in
    float32 and in mixed_bfloat16 (to `out/float32`, `out/mixed_bfloat16`)."""
    for precision in TPU_PRECISIONS:
        folder = os.path.join(out, precision)
        os.makedirs(folder, exist_ok=True)
        run(folder, "cpu", distribution=dict(
            jit_compile="on", micro_batches_per_execution=2, precision=precision,
        ))


if __name__ == "__main__":
    if sys.argv[2:] == ["tpu"]:
        run_tpu_settings(sys.argv[1])
    else:
        kill = tuple(int(n) for n in sys.argv[2].split(",")) if len(sys.argv) > 2 else None
        run(sys.argv[1], "multiworker", kill)
