"""Every use of Keras' private internals (and one of `tf.distribute`'s), in one place.

keras-vit needs a few things Keras does not expose publicly: where a preprocessing layer
draws its randomness, RandAugment's list of operations, the optimizer's gradient
clipping, the epoch `fit` resumes at, whether a model was built under a distribution
strategy, the optimizer's update step and Adam's moment slots, and two trainer hooks
(how `jit_compile="auto"` is resolved, and which batch builds the model before `fit`);
a functional model's graph run with each node called its own way, whether a layer's
call takes `training`, and the remat mode a layer was created under
(`VisionTransformer.call` on PyTorch); and, for keras-cv's layers, their random
generator and whether they augment a batch as a whole; and a layer without a name
scope of its own (`InParentNameScope`). Each is wrapped here, and
`tests/test_keras_compat.py` checks that each still exists and behaves as relied on, so
that a Keras release that changes one fails there, by name, rather than somewhere in
training. `progress_verbosity` works around how Keras' progress bar writes to a file or
a pipe. `pyproject.toml` keeps `keras` below the next major version.
"""

import contextlib
import functools
import sys


class InParentNameScope:
    """Mixin (before `keras.layers.Layer` in the bases) for a layer that opens no name
    scope of its own: its sublayers' variables are named in its parent's scope.

    Keras names a variable by the scopes of the layers around it when it is created
    (`Layer._open_name_scope`); a block made of such parts keeps its variables' paths,
    `block/qkv/kernel` rather than `block/attention/qkv/kernel`.

    Example:

    >>> import keras
    >>> class Part(InParentNameScope, keras.layers.Layer):
    ...     def build(self, input_shape):
    ...         self.dense = keras.layers.Dense(2, name="dense")
    ...         self.dense.build(input_shape)
    >>> class Whole(keras.layers.Layer):
    ...     def build(self, input_shape):
    ...         self.part = Part(name="part")
    ...         self.part.build(input_shape)
    >>> whole = Whole(name="whole")
    >>> whole.build((1, 3))
    >>> [v.path for v in whole.weights]
    ['whole/dense/kernel', 'whole/dense/bias']
    """

    def _open_name_scope(self):
        return contextlib.nullcontext()


def sublayers(layer):
    """`layer` and every layer nested in it, at any depth (Keras' `_flatten_layers`).

    Example:

    >>> import keras
    >>> block = keras.Sequential([keras.layers.Dense(2), keras.layers.RandomFlip()])
    >>> [type(sub).__name__ for sub in sublayers(block)]
    ['Sequential', 'Dense', 'RandomFlip']
    """
    return list(layer._flatten_layers(include_self=True))


def run_graph(model, inputs, call_node):
    """The outputs of functional `model` on `inputs`, each node of its graph computed
    by `call_node(operation, *args, **kwargs)` where `Functional.call` (without masks)
    calls `operation(*args, **kwargs)` (Keras' private `_standardize_inputs` and
    `_run_through_graph`).

    Example:

    >>> import keras
    >>> inputs = keras.Input((2,))
    >>> model = keras.Model(inputs, keras.layers.Dense(1, kernel_initializer="ones")(inputs))
    >>> called = []
    >>> def call_node(operation, *args, **kwargs):
    ...     called.append(type(operation).__name__)
    ...     return operation(*args, **kwargs)
    >>> float(run_graph(model, keras.ops.ones((1, 2)), call_node)[0, 0]), called
    (2.0, ['Dense'])
    """
    outputs = model._run_through_graph(
        model._standardize_inputs(inputs),
        operation_fn=lambda operation: functools.partial(call_node, operation),
    )
    # Keras' `unpack_singleton`: a model of one output returns it, not a list of one.
    return outputs[0] if isinstance(outputs, (list, tuple)) and len(outputs) == 1 else outputs


def call_takes_training(layer):
    """Whether `layer.call` has a `training` argument (Keras' `_call_has_training_arg`,
    which decides whether `Layer.__call__` passes the call context's `training` on).

    Example:

    >>> import keras
    >>> call_takes_training(keras.layers.Dropout(0.5)), call_takes_training(keras.layers.ReLU())
    (True, False)
    """
    return layer._call_has_training_arg


def remat_mode(layer):
    """The `keras.RematScope` mode `layer` was created under, or None (Keras'
    `_remat_mode`, with which `Layer.__call__` rematerialises the layer's call).

    Example:

    >>> import keras
    >>> with keras.RematScope(mode="full"):
    ...     layer = keras.layers.Dense(2)
    >>> remat_mode(layer).mode, remat_mode(keras.layers.Dense(2))
    ('full', None)
    """
    return layer._remat_mode


def replace_seed_generator(layer, generator):
    """Makes a random preprocessing `layer` draw its seeds from `generator`.

    Keras' data layers keep a `SeedGenerator` in `generator` and, under `tf.data` on
    another backend, one per backend in `_backend_generators`; both are replaced. Set
    with `object.__setattr__`, so Keras does not track a stateless generator as state.

    Example:

    >>> import keras
    >>> flip = keras.layers.RandomFlip()
    >>> generator = keras.random.SeedGenerator(7)
    >>> replace_seed_generator(flip, generator)
    >>> flip.generator is generator
    True
    """
    object.__setattr__(layer, "generator", generator)
    object.__setattr__(layer, "_backend_generators", {"tensorflow": generator})


def rand_augment_operations(layer):
    """The operations (layers) a `keras.layers.RandAugment` picks from, in its order.

    Example:

    >>> import keras
    >>> operations = rand_augment_operations(keras.layers.RandAugment())
    >>> len(operations), type(operations[0]).__name__
    (11, 'RandomShear')
    """
    return [getattr(layer, name) for name in layer._AUGMENT_LAYERS]


def clip_gradients_function(optimizer):
    """The function a Keras optimizer clips its gradients with (`clipnorm`, ...)."""
    return optimizer._clip_gradients


def set_clip_gradients_function(optimizer, clip):
    """Makes `optimizer` clip its gradients with `clip(grads) -> grads` instead.

    Example:

    >>> import keras
    >>> optimizer = keras.optimizers.SGD(clipvalue=1.0)
    >>> set_clip_gradients_function(optimizer, lambda grads: [2 * g for g in grads])
    >>> clip_gradients_function(optimizer)([1.0])
    [2.0]
    """
    optimizer._clip_gradients = clip


class UpdateStepHook:
    """`keras.optimizers.Optimizer` mixin with a hook into Keras' `apply`:
    `update_variables(grads, variables, learning_rate)` updates all the trainable
    variables at once in place of the optimizer's own update (Keras' private
    `_backend_update_step`, called with the clipped, accumulated gradients after the
    weight decay and before the moving average), or returns False to leave them to it.
    """

    def update_variables(self, grads, variables, learning_rate):
        return False

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not self.update_variables(grads, trainable_variables, learning_rate):
            super()._backend_update_step(grads, trainable_variables, learning_rate)


def adam_slots(optimizer, variables):
    """The moment slots a built Keras `Adam` keeps for each of `variables`: the lists of
    first moments, of second moments, and of maxima of the second moments (`amsgrad`;
    otherwise an empty list), each variable's value (a backend tensor)."""
    indices = [optimizer._get_variable_index(v) for v in variables]
    maxima = [optimizer._velocity_hats[i].value for i in indices] if optimizer.amsgrad else []
    return (
        [optimizer._momentums[i].value for i in indices],
        [optimizer._velocities[i].value for i in indices],
        maxima,
    )


def set_initial_epoch(model, epoch):
    """Makes the next `model.fit` start at `epoch` (0-based), as `BackupAndRestore` does."""
    model._initial_epoch = epoch


def built_strategy(model):
    """The `tf.distribute` strategy `model` was created under, or None.

    (`model.distribute_strategy` falls back to the current strategy instead.)

    Example:

    >>> import keras
    >>> built_strategy(keras.Sequential()) is None
    True
    """
    return model._distribute_strategy


def in_multi_worker_mode(strategy):
    """Whether a `MultiWorkerMirroredStrategy` spans several workers (tf.distribute's
    private `_in_multi_worker_mode`)."""
    return strategy.extended._in_multi_worker_mode()


def replace_keras_cv_generator(layer, generator):
    """Makes a keras-cv augmentation `layer` draw from `generator` (the
    `tf.random.Generator` keras-cv keeps in its private `_random_generator`)."""
    object.__setattr__(layer, "_random_generator", generator)


def keras_cv_mixes_batch(layer):
    """Whether a keras-cv augmentation layer overrides `BaseImageAugmentationLayer`'s
    private `_batch_augment` (it augments the batch as a whole, e.g. mixes its images)."""
    import keras_cv

    base = keras_cv.layers.BaseImageAugmentationLayer
    return type(layer)._batch_augment is not base._batch_augment


class AutoJitCompileHook:
    """`keras.Model` mixin: `auto_jit_compile()` decides what `jit_compile="auto"` means.

    Keras resolves `"auto"` in its private `_resolve_auto_jit_compile`, both in `compile`
    and when an uncompiled model first predicts. `auto_jit_compile` returns True or False,
    or None to leave the choice to Keras.
    """

    def auto_jit_compile(self):
        return None

    def _resolve_auto_jit_compile(self):
        choice = self.auto_jit_compile()
        return super()._resolve_auto_jit_compile() if choice is None else choice


class SymbolicBuildHook:
    """`keras.Model` mixin (TensorFlow backend): `symbolic_build_batch(iterator)` chooses
    the data batch Keras builds the model's metrics and optimizer from before `fit` or
    `evaluate` under a strategy (Keras' private `_maybe_symbolic_build`); it returns
    None to let Keras take its own.
    """

    def symbolic_build_batch(self, iterator):
        return None

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if iterator is not None:
            batch = self.symbolic_build_batch(iterator)
            if batch is not None:
                return super()._maybe_symbolic_build(data_batch=batch)
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)


def progress_verbosity(verbose="auto"):
    """Keras' `verbose` for a progress display: `"auto"` is 1 (a live bar) on a terminal
    and 2 (one line per epoch) otherwise; any other value is returned as it is.

    Keras' `Progbar` treats every POSIX process as a live terminal (it tests for `posix`
    in `sys.modules`), so a log written to a file or a pipe fills with carriage returns,
    backspaces and ANSI escapes; Keras' docs recommend `verbose=2` when not interactive.

    Example:

    >>> progress_verbosity(0), progress_verbosity(1)
    (0, 1)
    """
    if verbose != "auto":
        return verbose
    return 1 if sys.stdout.isatty() else 2
