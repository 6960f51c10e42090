"""Numeric settings out of range are refused before a run starts, with one line naming
the setting and its range; a run whose evaluation is not finite fails (exit 1), never
finished."""

import numpy as np
import keras
import pytest

from keras_vit import cli
from keras_vit.training import runs
from keras_vit.training.config import TrainConfig
from keras_vit.training.engine import train

# (--set assignment, the message it gets): each was accepted before, or ended in a NaN
# loss whose hint was to lower the learning rate.
OUT_OF_RANGE = [
    ("optimization.weight_decay=-0.1", "optimization.weight_decay must be in [0, inf), got -0.1."),
    ("optimization.clip_norm=-1", "optimization.clip_norm must be in (0, inf) or None, got -1.0."),
    ("optimization.label_smoothing=5",
     "optimization.label_smoothing must be in [0, 1), got 5.0."),
    ("optimization.momentum=nan", "optimization.momentum must be in [0, 1), got nan."),
    ("optimization.beta_2=1", "optimization.beta_2 must be in [0, 1), got 1.0."),
    ("data.mixup=-1", "data.mixup must be in [0, inf) or None, got -1.0."),
    ("data.cutmix=inf", "data.cutmix must be in [0, inf) or None, got inf."),
    ("data.randaugment=(2, 40)", "data.randaugment magnitude must be in [0, 30], got 40."),
    ("schedule.learning_rate=1e30", "schedule.learning_rate must be in (0, 10], got 1e+30."),
    ("schedule.learning_rate=inf", "schedule.learning_rate must be in (0, 10], got inf."),
    ("schedule.end_learning_rate=-1e-5",
     "schedule.end_learning_rate must be in [0, 10], got -1e-05."),
    ("schedule.warmup_updates=-5", "schedule.warmup_updates must be an integer >= 0, got -5."),
    ("model.head_bias_init=nan",
     "model.head_bias_init must be in (-inf, inf) or None, got nan."),
    ("model.channels=2", "Unknown model.channels 2: expected one of 1, 3."),
    ("evaluation.crop_fraction=0",
     "evaluation.crop_fraction must be in (0, 1] or None, got 0.0."),
    ("seed=-1", "seed must be an integer >= 0, got -1."),
]


@pytest.mark.parametrize("assignment, message", OUT_OF_RANGE)
def test_an_out_of_range_setting_is_one_line_naming_it_and_its_range(
    assignment, message, tmp_path, capsys
):
    code = cli.main(["pretrain", "--recipe", "demo", "--out", str(tmp_path / "run"),
                     "--set", assignment])
    err = capsys.readouterr().err
    assert code == 2
    assert err == f"keras-vit pretrain: error: {message}\n"
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_the_recipes_and_defaults_are_in_range():
    TrainConfig().validate()
    for name in ("pretrain", "finetune", "demo", "pretrain_mpp", "demo_mpp"):
        cli.load_recipe(name).validate()


class PoisonLastUpdate(keras.callbacks.Callback):
    """Makes the head NaN after the run's last training step, as a last update that
    diverged does: every training loss logged is finite, the evaluation is NaN."""

    def on_train_batch_end(self, batch, logs=None):
        if self.model.optimizer.iterations.numpy() == self.params["steps"] * self.params["epochs"]:
            head = self.model.get_layer("head").kernel
            head.assign(np.full(head.shape, np.nan, "float32"))


def tiny_config(out, every_epochs):
    return TrainConfig(
        model=dict(variant="custom", image_size=8, channels=1,
                   kwargs=dict(patch_size=4, hidden_dim=16, num_layers=1, num_heads=2,
                               mlp_dim=32)),
        data=dict(batch_size=32, inception_crop=False, random_flip=False),
        schedule=dict(epochs=2, micro_batches_per_epoch=2, learning_rate=1e-3),
        checkpointing=dict(tensorboard=False),
        distribution=dict(jit_compile="off"),
        evaluation=dict(every_epochs=every_epochs),
        out=str(out),
    )


@pytest.mark.parametrize("every_epochs, when", [
    (1, "val_loss nan in epoch 2"),  # evaluated at the end of each epoch
    (5, "loss nan in the final evaluation"),  # only by the final evaluation
])
def test_a_run_whose_evaluation_is_nan_fails_and_is_not_finished(tmp_path, every_epochs, when):
    config = tiny_config(tmp_path, every_epochs)
    with pytest.raises(FloatingPointError, match=f"Training stopped: {when}"):
        train(config, callbacks=[PoisonLastUpdate()], verbose=0)
    assert runs.status(str(tmp_path)) != "finished"
    assert not (tmp_path / runs.METRICS_JSON).exists()
    assert not (tmp_path / runs.MODEL).exists()
    if every_epochs > 1:
        return  # epoch 2's metrics were finite: its checkpoint and backup were written
    # The last checkpoint is epoch 1's, written before the poison, and finite.
    checkpoint = runs.latest_checkpoint(str(tmp_path))
    assert checkpoint.endswith("epoch_0001.keras")
    assert all(np.isfinite(w).all() for w in keras.saving.load_model(checkpoint).get_weights())
