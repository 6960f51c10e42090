"""The training engine: schedule, weight decay, accumulation, losses, strategies, resume."""

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
from helpers import RESUMABLE, TINY_RUN, tiny_run, tiny_vit

from keras_vit.training import runs
from keras_vit.training.losses import SigmoidCrossEntropy
from keras_vit.training.optimizers import decayed_variables, make_optimizer
from keras_vit.training.schedules import WarmupDecay

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_RUN = ROOT / "tests" / "fixtures" / "run_v0_1_0"  # written by keras-vit 0.1 (25b1e66)


def _formula(step, base, total, warmup, decay, end):
    """The schedule written out independently: big_vision's warmup times decay."""
    warm = min(1.0, step / warmup) if warmup else 1.0
    progress = min(max((step - warmup) / (total - warmup), 0.0), 1.0)
    if decay == "linear":
        factor = end / base + (1 - end / base) * (1 - progress)
    elif decay == "cosine":
        factor = 0.5 * (1 + math.cos(math.pi * progress))
    else:
        factor = 1.0
    return base * warm * factor


@pytest.mark.parametrize("decay", ["linear", "cosine", "constant"])
def test_schedule_equals_its_formula(decay):
    schedule = WarmupDecay(1e-3, total_steps=1000, warmup_steps=100, decay=decay)
    for step in (0, 1, 50, 99, 100, 101, 420, 999, 1000, 5000):
        expected = _formula(step, 1e-3, 1000, 100, decay, 1e-5)
        np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-5, atol=1e-9)  # float32
    # The paper's linear decay ends at 1e-5.
    if decay == "linear":
        np.testing.assert_allclose(float(schedule(1000)), 1e-5, rtol=1e-6)
    # Serializable: a Keras round trip gives the same schedule.
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert restored.get_config() == schedule.get_config()


def test_schedule_counts_updates_under_accumulation():
    # Keras calls the schedule with micro-steps; 4 micro-steps make one update.
    schedule = WarmupDecay(1.0, total_steps=10, warmup_steps=4, accumulation_steps=4)
    for micro in range(40):
        assert float(schedule(micro)) == pytest.approx(_formula(micro // 4, 1.0, 10, 4, "linear", 1e-5))


def test_schedule_rejects_bad_arguments():
    with pytest.raises(ValueError, match="'exp'"):
        WarmupDecay(1e-3, total_steps=10, decay="exp")
    with pytest.raises(ValueError, match="warmup_steps \\(10\\)"):
        WarmupDecay(1e-3, total_steps=10, warmup_steps=10)


def test_weight_decay_reaches_exactly_the_kernels():
    model = tiny_vit(representation_size=32)
    optimizer = make_optimizer("adam", 0.01, model, weight_decay=0.1, clip_norm=None)
    before = {v.path: np.array(v) for v in model.trainable_variables}
    # Zero gradients: Adam's step is 0, so only the decoupled decay moves weights.
    optimizer.apply([keras.ops.zeros_like(v) for v in model.trainable_variables],
                    model.trainable_variables)
    decayed = {
        v.path for v in model.trainable_variables
        if not np.array_equal(np.array(v), before[v.path])
    }
    kernels = {v.path for v in model.trainable_variables if v.path.endswith("/kernel")}
    expected_kernels = {
        "patch_encoder/projection/kernel", "pre_logits/kernel", "head/kernel",
        *(f"encoderblock_{i}/{name}/kernel" for i in range(2)
          for name in ("qkv", "attention_output", "mlp_fc1", "mlp_fc2")),
    }
    assert kernels == expected_kernels
    # The zero-initialised head kernel stays zero; every other kernel shrinks.
    assert decayed == kernels - {"head/kernel"}
    assert {v.path for v in decayed_variables(model)} == kernels
    for v in model.trainable_variables:
        if v.path in decayed:
            np.testing.assert_allclose(np.array(v), before[v.path] * (1 - 0.01 * 0.1), rtol=1e-6)


def test_decayed_kernels_of_every_trained_model_are_its_kernel_weights():
    """The kernels the models declare are the weights Keras names "kernel" (what 0.1.0
    decayed), for the wrapped classifier, a hybrid and the MPP model with its head."""
    from keras_vit.models.mpp import MaskedPatchPrediction
    from keras_vit.training.engine import TrainingModel

    def named_kernels(model):
        return {v.path for v in model.trainable_variables if v.name == "kernel"}

    hybrid = tiny_vit(patch_size=1, resnet_stages=(1,), image_size=32)
    mpp = MaskedPatchPrediction(tiny_vit(include_top=False))
    for model in (TrainingModel.wrap(hybrid), hybrid, mpp):
        paths = [v.path for v in decayed_variables(model)]
        assert len(paths) == len(set(paths)) and set(paths) == named_kernels(model)
    assert mpp.head.kernel.path in {v.path for v in decayed_variables(mpp)}
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="plain")
    with pytest.raises(ValueError, match=r"Weight decay needs a keras-vit model .*'plain' is a Sequential"):
        make_optimizer("adam", 0.01, plain, weight_decay=0.1)


def _train_steps(model, optimizer, batches):
    """Eager training steps: the optimizer sees each batch's mean-loss gradients."""
    import tensorflow as tf

    loss = keras.losses.CategoricalCrossentropy(from_logits=True)
    for images, labels in batches:
        with tf.GradientTape() as tape:
            value = loss(labels, model(images, training=True))
        grads = tape.gradient(value, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
    return [np.array(v) for v in model.trainable_variables]


def test_gradient_accumulation_equals_one_big_step():
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (2, 32, 32, 32, 3)).astype("float32")  # 2 updates of 32
    labels = np.eye(10, dtype="float32")[rng.integers(0, 10, (2, 32))]
    head = keras.initializers.RandomNormal(stddev=0.1)
    reference = tiny_vit()
    reference.get_layer("head").kernel.assign(head((32, 10)))
    initial = reference.get_weights()

    def optimizer(model, k):
        schedule = WarmupDecay(3e-3, total_steps=10, warmup_steps=1, accumulation_steps=k)
        return make_optimizer("adam", schedule, model, weight_decay=0.1, clip_norm=0.5,
                              accumulation_steps=k)

    big = tiny_vit()
    big.set_weights(initial)
    big_weights = _train_steps(big, optimizer(big, 1), zip(images, labels))
    small = tiny_vit()
    small.set_weights(initial)
    micro = [(images[u, i * 8:(i + 1) * 8], labels[u, i * 8:(i + 1) * 8])
             for u in range(2) for i in range(4)]
    small_weights = _train_steps(small, optimizer(small, 4), micro)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(big_weights, initial))
    assert moved > 1e-3  # the comparison below is not between untouched weights
    for a, b in zip(big_weights, small_weights):
        np.testing.assert_allclose(a, b, atol=2e-6)


def test_sigmoid_cross_entropy_sums_over_classes():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, 7)).astype("float32")
    targets = (rng.uniform(size=(4, 7)) < 0.3).astype("float32")
    probabilities = 1 / (1 + np.exp(-logits.astype("float64")))
    expected = -(targets * np.log(probabilities) + (1 - targets) * np.log(1 - probabilities))
    loss = float(SigmoidCrossEntropy()(targets, logits))
    np.testing.assert_allclose(loss, expected.sum(1).mean(), rtol=1e-5)


# --- whole runs, in fresh processes ---------------------------------------------------


def _python(script, *args, env_extra=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", **(env_extra or {})}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _finish(process, timeout=600):
    stdout, stderr = process.communicate(timeout=timeout)
    return process.returncode, stdout, stderr


MIRRORED = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import numpy as np
from keras_vit.training.engine import TrainConfig, train
weights = {}
for strategy in ("cpu", "mirrored"):
    config = TrainConfig.from_dict(json.loads(sys.argv[1])).replace(
        distribution=dict(strategy=strategy), out=sys.argv[2] + strategy)
    weights[strategy] = train(config, verbose=0).model.get_weights()
    print(strategy, json.load(open(sys.argv[2] + strategy + "/metrics.json"))["strategy"])
difference = max(float(np.abs(a - b).max()) for a, b in zip(*weights.values()))
print("max difference", difference)
"""


def test_mirrored_over_two_cpus_matches_one_device(tmp_path):
    # Two micro-batches per execution: one device runs them in one call, the two replicas
    # one a call (Keras' multi-step loop fails with their all-reduce), with the same updates.
    config = tiny_run(
        schedule=dict(epochs=1, micro_batches_per_epoch=4),
        distribution=dict(micro_batches_per_execution=2),
    )
    code, stdout, stderr = _finish(_python(MIRRORED, json.dumps(config), str(tmp_path / "run_")))
    assert code == 0, stderr[-3000:]
    print(stdout)
    assert "mirrored MirroredStrategy, 2 replicas" in stdout
    assert ("distribution.micro_batches_per_execution 2 runs as 1 under MirroredStrategy "
            "with 2 replicas") in stderr
    difference = float(stdout.split("max difference")[1])
    assert difference < 1e-5


@pytest.mark.slow  # kills and restarts training processes
@pytest.mark.parametrize("objective", ["supervised", "mpp"])
def test_run_killed_mid_epoch_resumes_to_the_same_weights(tmp_path, objective):
    # Dropout (seed states), MixUp (stream seeds), accumulation and a schedule make
    # every piece of state matter; masked patch prediction adds its corruption draws.
    config = tiny_run(
        optimization=dict(objective=objective, micro_batches_per_update=2),
        schedule=dict(epochs=3, micro_batches_per_epoch=6, decay="cosine"),
        checkpointing=dict(backup_every_micro_batches=2),
        distribution=dict(deterministic=True),
        data=dict(mixup=0.2),
        model=dict(kwargs=dict(TINY_RUN["model"]["kwargs"], dropout_rate=0.1)),
    )
    config = json.dumps(config)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    # Killed after step 5 of epoch 2 (backups after steps 2 and 4 of each epoch).
    first = _python(RESUMABLE, config, str(straight))
    second = _python(RESUMABLE, config, str(killed), "1:5")
    code, _, stderr = _finish(first)
    assert code == 0, stderr[-3000:]
    code, _, stderr = _finish(second)
    assert code == -signal.SIGKILL, stderr[-3000:]
    from keras_vit.training.callbacks import TrainingBackup

    assert TrainingBackup.saved_position(str(killed / runs.BACKUP)) == (1, 4)
    code, _, stderr = _finish(_python(RESUMABLE, config, str(killed)))
    assert code == 0, stderr[-3000:]
    assert not (killed / runs.BACKUP).exists()  # finished: the backup and its folder removed
    epochs = [line.split(",")[0] for line in (killed / runs.METRICS_CSV).read_text().splitlines()[1:]]
    assert epochs == ["0", "1", "2"]
    expected = keras.saving.load_model(straight / runs.MODEL).get_weights()
    resumed = keras.saving.load_model(killed / runs.MODEL).get_weights()
    for a, b in zip(expected, resumed):
        np.testing.assert_array_equal(a, b)


class Poison(keras.callbacks.Callback):
    """Makes the weights NaN after the first step of epoch `epoch` (from 0)."""

    def __init__(self, epoch):
        super().__init__()
        self.at = (epoch, 0)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            head = self.model.get_layer("head").kernel
            head.assign(np.full(head.shape, np.nan, "float32"))


def test_nan_loss_stops_and_keeps_the_last_good_state(tmp_path):
    from keras_vit.training.callbacks import TrainingBackup
    from keras_vit.training.engine import TrainConfig, train

    config = TrainConfig(
        **tiny_run(schedule=dict(epochs=3, micro_batches_per_epoch=3)), out=str(tmp_path)
    )
    backup = tmp_path / runs.BACKUP / TrainingBackup.FILE
    with pytest.raises(
        FloatingPointError,
        match=f"in epoch 2. Last good checkpoint: .*epoch_0001.keras; the backup {backup} holds",
    ):
        train(config, callbacks=[Poison(1)], verbose=0)
    assert runs.latest_checkpoint(str(tmp_path)).endswith("epoch_0001.keras")
    kept = keras.saving.load_model(runs.latest_checkpoint(str(tmp_path)))
    assert all(np.isfinite(w).all() for w in kept.get_weights())
    assert not (tmp_path / runs.MODEL).exists()
    # The backup still holds the end of epoch 1, from where a fixed run can resume.
    assert TrainingBackup.saved_position(str(tmp_path / runs.BACKUP)) == (1, 0)


def test_nan_loss_in_the_first_epoch_names_no_backup(tmp_path):
    from keras_vit.training.engine import TrainConfig, train

    config = TrainConfig(
        **tiny_run(schedule=dict(epochs=2, micro_batches_per_epoch=2)), out=str(tmp_path)
    )
    with pytest.raises(
        FloatingPointError,
        match="in epoch 1. Last good checkpoint: none; no backup was written yet: lower the "
        "learning rate and start over",
    ):
        train(config, callbacks=[Poison(0)], verbose=0)
    assert not (tmp_path / runs.BACKUP).exists()


def test_a_version_0_1_run_is_resumed_only_by_its_own_settings(caplog):
    """The flat config.json of a keras-vit 0.1 run folder is what resuming compares with."""
    from keras_vit.training.config import TrainConfig
    from keras_vit.training.engine import check_resumable

    saved = json.loads((FIXTURE_RUN / runs.CONFIG).read_text())
    config = TrainConfig.from_dict(saved)
    assert runs.run_config(str(FIXTURE_RUN)) == config
    assert runs.resolve_from(str(FIXTURE_RUN)).path == str(FIXTURE_RUN / runs.MODEL)
    check_resumable(config, str(FIXTURE_RUN))
    check_resumable(config.replace(out="elsewhere", distribution=dict(strategy="cpu")),
                    str(FIXTURE_RUN))
    changed = config.replace(schedule=dict(learning_rate=1e-3), data=dict(classes=None))
    with pytest.raises(ValueError, match=r"differs in \['data.classes', 'schedule.learning_rate'\]"):
        check_resumable(changed, str(FIXTURE_RUN))


def test_functional_engine_model_leaves_the_shared_classes_alone():
    """Building `TrainingModel` from a graph makes Keras rewrite `keras.Model` in its bases
    to `Functional`; an MPP model made afterwards in the same process must still build
    (it failed with "Functional.__init__() missing 'outputs'" when they shared a base)."""
    from keras_vit.training.multiworker import MultiWorkerModel
    from keras_vit.training.engine import MaskedPatchTraining, TrainingModel

    classifier = tiny_vit(num_classes=3)
    TrainingModel.wrap(classifier)
    MultiWorkerModel(classifier.inputs, classifier.outputs)
    encoder = tiny_vit(include_top=False)
    assert MaskedPatchTraining(encoder, seed=0).encoder is encoder
