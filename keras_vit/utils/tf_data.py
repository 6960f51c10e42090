"""The `tf.data` datasets keras-vit hands to Keras (TensorFlow-only): without tf.data's
autotuning, and arrays in batches.

`keras_vit.data`'s pipelines end in `without_autotuning`; `VisionTransformer.fit`,
`predict` and `evaluate` read arrays on TensorFlow as `array_batches` batches them. Both are here,
below the model and the data pipelines, so that the model reads arrays without
importing `keras_vit.data`.
"""

import math
import os

import numpy as np
import tensorflow as tf

# The values of `keras.Model.fit`'s `shuffle` that `array_batches` takes.
SHUFFLES = (True, False, "batch")


def without_autotuning(dataset):
    """`dataset` with tf.data's autotuning off and each `AUTOTUNE` map one call per core.

    An autotuned iterator runs an optimisation thread whose sleep doubles from 10 ms up to
    60 s, and destroying the iterator can wait for that thread's next wake-up: a `fit`,
    `evaluate`, `predict` or Python loop over the dataset lasting from a second to a minute
    could take up to twice as long, and longer ones up to a minute more. One call per
    core is the ceiling autotuning raises these CPU-bound maps to (`python
    bench/input_pipeline.py` checks that the training pipeline still outruns training). Pass your own `tf.data`
    datasets through it before `fit`, `evaluate` or `predict`.

    Example:

    >>> dataset = without_autotuning(tf.data.Dataset.range(3))
    >>> dataset.options().autotune.enabled, [int(x) for x in dataset]
    (False, [0, 1, 2])
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    options.autotune.initial_parallelism = os.cpu_count() or 1
    return dataset.with_options(options)


def array_batches(arrays, batch_size, shardable=True, shuffle=False):
    """`arrays` (an array, or a tuple of arrays of one length) in batches of `batch_size`
    (the last one smaller), through `without_autotuning`. What `VisionTransformer.fit`,
    `predict` and `evaluate` read arrays as on TensorFlow.

    `shardable` (the default) makes the batches from one tensor of all of `arrays`,
    which a `tf.distribute` strategy shards by example across workers as Keras shards
    arrays. `shardable=False`, for a model without a strategy, slices NumPy arrays (or
    anything `np.asarray` reads, unless one of `arrays` is a TensorFlow tensor already)
    one batch at a time as the batches are read: the same batches, without first copying
    the whole arrays into a tensor.

    `shuffle` orders the examples as `keras.Model.fit`'s argument of that name does,
    afresh on each pass over the dataset: `True`, a random permutation of all of them;
    `"batch"`, the batches in order, each one's examples in a random order; `False`, in
    order. Shuffled batches are gathered from the arrays, and need `shardable=False`.

    Example:

    >>> [int(images.shape[0]) for images, _ in array_batches((tf.zeros((5, 2)), tf.range(5)), 2)]
    [2, 2, 1]
    >>> [b.tolist() for b in array_batches(np.arange(5), 2, shardable=False).as_numpy_iterator()]
    [[0, 1], [2, 3], [4]]
    >>> shuffled = array_batches(np.arange(5), 2, shardable=False, shuffle=True)
    >>> sorted(np.concatenate(list(shuffled.as_numpy_iterator())).tolist())
    [0, 1, 2, 3, 4]
    """
    if shuffle not in SHUFFLES:
        raise ValueError(f"shuffle={shuffle!r}: expected True, False or 'batch', as Keras' fit.")
    single = not isinstance(arrays, tuple)
    arrays = (arrays,) if single else arrays
    tensors = any(tf.is_tensor(a) for a in arrays)
    if shuffle and (shardable or tensors):
        raise ValueError(
            "array_batches shuffles NumPy arrays sliced a batch at a time: pass "
            "shardable=False and arrays, not TensorFlow tensors."
        )
    if shardable or tensors:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA
        )
        dataset = tf.data.Dataset.from_tensor_slices(arrays[0] if single else arrays)
        return without_autotuning(dataset.batch(batch_size).with_options(options))
    arrays = tuple(np.asarray(a) for a in arrays)
    shapes = [tf.TensorShape([None, *a.shape[1:]]) for a in arrays]
    dtypes = [tf.as_dtype(a.dtype) for a in arrays]

    if shuffle:
        # The examples' indices, a batch of them at a time; tf.data's shuffle draws a new
        # order on each pass (from the global seed, which keras.utils.set_random_seed sets).
        order = tf.data.Dataset.range(len(arrays[0]))
        if shuffle != "batch":
            order = order.shuffle(len(arrays[0]), reshuffle_each_iteration=True)
        order = order.batch(batch_size)
        if shuffle == "batch":
            order = order.map(tf.random.shuffle)

        def sliced(indices):
            return [a[indices] for a in arrays]
    else:
        order = tf.data.Dataset.range(-(-len(arrays[0]) // batch_size))

        def sliced(index):
            start = index * batch_size
            return [a[start : start + batch_size] for a in arrays]

    def read(index):
        parts = tf.numpy_function(sliced, [index], dtypes, stateful=False)
        parts = [tf.ensure_shape(part, shape) for part, shape in zip(parts, shapes)]
        return parts[0] if single else tuple(parts)

    return without_autotuning(order.map(read))


def array_fit_arguments(arguments):
    """`keras.Model.fit`'s `arguments` (a dict of all of them, by name) with NumPy arrays
    read through `array_batches(..., shardable=False)`: arrays `x` and `y` with no
    `sample_weight`, `class_weight` or `steps_per_epoch`, batched and shuffled as Keras
    would, and the validation arrays of `validation_split` (Keras' split: the last
    fraction, before shuffling) or of a `(x, y)` `validation_data`. Other `arguments`
    come back as they are, for Keras to read. For a model without a `tf.distribute`
    strategy (`VisionTransformer.fit`).

    Example:

    >>> arguments = dict(x=np.zeros((10, 2)), y=np.arange(10), batch_size=4, shuffle=False,
    ...                  validation_split=0.2, validation_data=None, validation_batch_size=None,
    ...                  sample_weight=None, class_weight=None, steps_per_epoch=None)
    >>> read = array_fit_arguments(arguments)
    >>> [len(y) for _, y in read["x"]], [y.numpy().tolist() for _, y in read["validation_data"]]
    ([4, 4], [[8, 9]])
    """
    x, y = arguments["x"], arguments["y"]
    if (
        arguments["shuffle"] not in SHUFFLES
        or any(arguments[k] is not None
               for k in ("sample_weight", "class_weight", "steps_per_epoch"))
        or not (_is_host_array(x) and _is_host_array(y))
    ):
        return arguments
    x, y = np.asarray(x), np.asarray(y)
    validation = arguments["validation_data"]
    split = arguments["validation_split"]
    if split and validation is None:
        split_at = math.floor(len(x) * (1.0 - split))
        if split_at in (0, len(x)):
            return arguments  # Keras says why it cannot split them
        x, y, validation = x[:split_at], y[:split_at], (x[split_at:], y[split_at:])
    batch_size = arguments["batch_size"] or 32  # Keras' default
    batches = array_batches((x, y), batch_size, shardable=False, shuffle=arguments["shuffle"])
    read = dict(arguments, x=batches, y=None, batch_size=None, shuffle=False,
                validation_split=0.0, validation_data=validation)
    pair = isinstance(validation, tuple) and len(validation) == 2
    if pair and all(map(_is_host_array, validation)):
        read.update(
            validation_data=array_batches(
                validation, arguments["validation_batch_size"] or batch_size, shardable=False
            ),
            validation_batch_size=None,
        )
    return read


def is_array(value):
    """Whether Keras reads `value` as an array: anything with a `shape` and a `dtype`
    (NumPy's arrays, the backends' tensors).

    Example:

    >>> is_array(np.zeros(3)), is_array([0.0, 1.0])
    (True, False)
    """
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _is_host_array(value):
    """Whether `value` is an array (`is_array`) and not a TensorFlow tensor."""
    return is_array(value) and not tf.is_tensor(value)
