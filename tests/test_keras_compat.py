"""The Keras internals keras_vit.utils.keras_compat wraps still exist and behave as relied on.

Each test names the internal it checks, so a Keras release that changes one fails here.
"""

import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_vit.utils import keras_compat

ROOT = Path(__file__).resolve().parents[1]


def _tiny_model(cls=keras.Model):
    inputs = keras.Input((2,))
    return cls(inputs, keras.layers.Dense(1)(inputs))


class CountingSeeds(keras.random.SeedGenerator):
    """A stateless seed source that counts the draws made from it."""

    def __init__(self):
        self.name = "counting_seeds"
        self.draws = 0

    def next(self, ordered=True):
        self.draws += 1
        return tf.constant([self.draws, 0], tf.int32)


def test_flatten_layers_reaches_nested_layers():
    inner = keras.layers.RandomFlip()
    block = keras.Sequential([keras.layers.Dense(2), keras.Sequential([inner])])
    found = keras_compat.sublayers(block)
    assert found[0] is block and any(layer is inner for layer in found)


def test_a_part_without_name_scope_names_variables_in_its_parents_scope():
    class Part(keras_compat.InParentNameScope, keras.layers.Layer):
        def build(self, input_shape):
            self.dense = keras.layers.Dense(2, name="dense")
            self.dense.build(input_shape)

    class Whole(keras.layers.Layer):
        def build(self, input_shape):
            self.part = Part(name="part")
            self.part.build(input_shape)

        def call(self, x):
            return self.part.dense(x)

    whole = Whole(name="whole")
    whole(keras.ops.ones((1, 3)))  # built through Keras' own call
    assert [v.path for v in whole.weights] == ["whole/dense/kernel", "whole/dense/bias"]
    assert whole.part.dense.path == "whole/dense"


def test_run_graph_computes_each_node_by_the_given_call():
    inputs = keras.Input((3,))
    first, second = keras.layers.Dense(4), keras.layers.Dense(2)
    hidden = first(inputs)
    model = keras.Model(inputs, [second(hidden), hidden])
    x = keras.ops.convert_to_tensor(np.arange(6, dtype="float32").reshape(2, 3))
    called = []

    def call_node(operation, *args, **kwargs):
        called.append(operation)
        return operation.call(*args, **kwargs)

    outputs = keras_compat.run_graph(model, x, call_node)
    assert called == [first, second]
    for ours, keras_own in zip(outputs, model(x), strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours),
                                      keras.ops.convert_to_numpy(keras_own))


def test_call_takes_training_and_remat_mode_are_what_layer_call_reads():
    assert keras_compat.call_takes_training(keras.layers.Dropout(0.5))
    assert not keras_compat.call_takes_training(keras.layers.ReLU())
    with keras.RematScope(mode="full"):
        rematerialised = keras.layers.Dense(2)
    assert keras_compat.remat_mode(rematerialised).mode == "full"
    assert keras_compat.remat_mode(keras.layers.Dense(2)) is None


def test_random_layers_draw_from_the_replaced_generator():
    """Layer._get_seed_generator returns `generator` (own backend) or `_backend_generators`."""
    image = tf.random.uniform((8, 8, 3))
    for layer in (keras.layers.RandomFlip(), keras.layers.RandomTranslation(0.2, 0.2)):
        seeds = CountingSeeds()
        keras_compat.replace_seed_generator(layer, seeds)
        layer(image, training=True)
        assert seeds.draws > 0, f"{type(layer).__name__} did not draw from its `generator`"
        assert layer._get_seed_generator("tensorflow") is seeds
        assert layer._backend_generators["tensorflow"] is seeds


def test_randaugment_operations_are_its_sublayers():
    layer = keras.layers.RandAugment(value_range=(0, 255), num_ops=2, factor=0.5)
    operations = keras_compat.rand_augment_operations(layer)
    assert len(operations) >= 10
    assert all(isinstance(op, keras.layers.Layer) for op in operations)
    nested = {id(sub) for sub in keras_compat.sublayers(layer)[1:]}
    assert {id(op) for op in operations} == nested, "RandAugment picks from other layers"
    image = tf.fill((8, 8, 3), 128.0)
    for op in operations:
        assert tuple(op(image).shape) == (8, 8, 3)


def test_clip_gradients_is_the_optimizers_clipping_and_apply_uses_it():
    optimizer = keras.optimizers.SGD(learning_rate=1.0, global_clipnorm=1.0)
    clipped = keras_compat.clip_gradients_function(optimizer)([tf.constant([3.0, 4.0])])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(clipped[0]), [0.6, 0.8], rtol=1e-6)

    variable = keras.Variable([0.0, 0.0])
    keras_compat.set_clip_gradients_function(optimizer, lambda grads: [2.0 * g for g in grads])
    optimizer.apply_gradients([(tf.constant([1.0, -1.0]), variable)])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), [-2.0, 2.0])


def test_update_step_hook_replaces_the_update_rule_after_clip_and_decay():
    class Hooked(keras_compat.UpdateStepHook, keras.optimizers.SGD):
        takes = True

        def update_variables(self, grads, variables, learning_rate):
            if self.takes:
                for grad, variable in zip(grads, variables):
                    variable.assign(variable - 2.0 * learning_rate * grad)
            return self.takes

    for takes, expected in ((True, [-0.7, -1.1]), (False, [-0.1, -0.3])):
        optimizer = Hooked(learning_rate=1.0, global_clipnorm=1.0, weight_decay=0.5)
        optimizer.takes = takes
        variable = keras.Variable([1.0, 1.0])
        # Decay first (to 0.5), then the step of the gradients clipped to norm 1 (0.6,
        # 0.8): the hook's (doubled) or SGD's own.
        optimizer.apply([tf.constant([3.0, 4.0])], [variable])
        np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), expected, rtol=1e-6)


def test_adam_slots_are_its_moments():
    variables = [keras.Variable([1.0, 2.0]), keras.Variable([3.0])]
    grads = [tf.constant([0.5, -1.0]), tf.constant([2.0])]
    optimizer = keras.optimizers.Adam(beta_1=0.9, beta_2=0.99, amsgrad=True)
    optimizer.apply(grads, variables)
    momentums, velocities, maxima = keras_compat.adam_slots(optimizer, variables[::-1])
    for slot, factor in ((momentums, 0.1), (velocities, 0.01), (maxima, 0.01)):
        power = 1 if slot is momentums else 2
        for value, grad in zip(slot, grads[::-1]):
            np.testing.assert_allclose(keras.ops.convert_to_numpy(value),
                                       factor * grad.numpy() ** power, rtol=1e-6)
    assert keras_compat.adam_slots(keras.optimizers.Adam(), [])[2] == []


def test_initial_epoch_set_at_train_begin_moves_fit_on():
    class Resume(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            keras_compat.set_initial_epoch(self.model, 2)

    model = _tiny_model()
    model.compile("sgd", "mse")
    history = model.fit(
        np.zeros((4, 2)), np.zeros((4, 1)), epochs=3, verbose=0, callbacks=[Resume()]
    )
    assert history.epoch == [2]


def test_built_strategy_is_the_creation_scope_only():
    assert keras_compat.built_strategy(_tiny_model()) is None
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = _tiny_model()
    assert keras_compat.built_strategy(model) is strategy
    # What the public property cannot tell: it falls back to the default strategy.
    assert _tiny_model().distribute_strategy is not None


def test_resolve_auto_jit_compile_hook_decides_auto():
    class Decides(keras_compat.AutoJitCompileHook, keras.Model):
        choice = None

        def auto_jit_compile(self):
            return self.choice

    for choice in (True, False):
        model = _tiny_model(Decides)
        model.choice = choice
        model.compile("sgd", "mse")  # jit_compile="auto"
        assert model.jit_compile is choice
        model.compile("sgd", "mse", jit_compile=not choice)
        assert model.jit_compile is (not choice)


def test_symbolic_build_hook_gets_the_fit_iterator_under_a_strategy():
    class Builds(keras_compat.SymbolicBuildHook, keras.Model):
        batches = []

        def symbolic_build_batch(self, iterator):
            for _, _, it in iterator:  # Keras' epoch iterator yields (begin, end, iterator)
                batch = next(it)
                self.batches.append(batch)
                return batch

    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        model = _tiny_model(Builds)
        model.compile("sgd", "mse", metrics=["mae"])
    model.fit(np.ones((4, 2), "float32"), np.ones((4, 1), "float32"), batch_size=2, verbose=0)
    assert len(Builds.batches) == 1
    assert tuple(Builds.batches[0][0].shape) == (2, 2)


@pytest.mark.slow  # a process of its own: the strategy sets up collective ops
def test_multi_worker_mode_of_a_single_worker_strategy():
    script = (
        "import tensorflow as tf\n"
        "from keras_vit.utils import keras_compat\n"
        "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
        "print('multi-worker', keras_compat.in_multi_worker_mode(strategy))\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "multi-worker False" in result.stdout


class DrawMade(Exception):
    pass


class RecordingGenerator:
    """Stands in for a `tf.random.Generator`: any draw raises `DrawMade(method)`."""

    def __getattr__(self, name):
        raise DrawMade(name)


def test_keras_cv_layers_draw_from_the_replaced_generator():
    keras_cv = pytest.importorskip("keras_cv")
    layer = keras_cv.layers.RandomFlip("horizontal")
    keras_compat.replace_keras_cv_generator(layer, RecordingGenerator())
    with pytest.raises(DrawMade):
        layer(tf.zeros((2, 8, 8, 3)), training=True)


def test_keras_cv_batch_augment_tells_the_mixing_layers():
    keras_cv = pytest.importorskip("keras_cv")
    assert keras_compat.keras_cv_mixes_batch(keras_cv.layers.Mosaic())
    assert keras_compat.keras_cv_mixes_batch(keras_cv.layers.FourierMix())
    assert not keras_compat.keras_cv_mixes_batch(keras_cv.layers.GridMask())


@pytest.mark.slow  # installs the lowest Keras the pin allows into a venv (pip, from PyPI)
def test_every_wrapped_internal_holds_on_the_lowest_keras_the_pin_allows(tmp_path):
    """The checks above and keras_compat's examples, on `keras==FLOOR` of pyproject's pin
    (this process runs them on the newest Keras pip installs)."""
    import re

    floor = re.search(r'"keras>=([\d.]+)', (ROOT / "pyproject.toml").read_text()).group(1)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", f"keras=={floor}"],
        capture_output=True, text=True, timeout=600,
    )
    if install.returncode:
        pytest.skip(f"keras=={floor} could not be installed from PyPI: {install.stderr[-300:]}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    version = subprocess.run([python, "-c", "import keras; print(keras.__version__)"],
                             env=env, capture_output=True, text=True).stdout.strip()
    from packaging.version import Version

    assert Version(version) == Version(floor)
    result = subprocess.run(
        [python, "-m", "pytest", "-p", "no:cacheprovider", "-m", "not slow", "-q",
         "tests/test_keras_compat.py", "keras_vit/utils/keras_compat.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:]
