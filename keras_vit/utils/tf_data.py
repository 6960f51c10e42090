"""The `tf.data` datasets keras-vit hands to Keras (TensorFlow-only): without tf.data's
autotuning, and arrays in batches.

`keras_vit.data`'s pipelines end in `without_autotuning`; `VisionTransformer.predict`
and `evaluate` read arrays on TensorFlow as `array_batches` batches them. Both are here,
below the model and the data pipelines, so that the model reads arrays without
importing `keras_vit.data`.
"""

import os

import numpy as np
import tensorflow as tf


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


def array_batches(arrays, batch_size, shardable=True):
    """`arrays` (an array, or a tuple of arrays of one length) in order, in batches of
    `batch_size` (the last one smaller), through `without_autotuning`. What
    `VisionTransformer.predict` and `evaluate` read arrays as on TensorFlow.

    `shardable` (the default) makes the batches from one tensor of all of `arrays`,
    which a `tf.distribute` strategy shards by example across workers as Keras shards
    arrays. `shardable=False`, for a model without a strategy, slices NumPy arrays (or
    anything `np.asarray` reads, unless one of `arrays` is a TensorFlow tensor already)
    one batch at a time as the batches are read: the same batches, without first copying
    the whole arrays into a tensor.

    Example:

    >>> [int(images.shape[0]) for images, _ in array_batches((tf.zeros((5, 2)), tf.range(5)), 2)]
    [2, 2, 1]
    >>> [b.tolist() for b in array_batches(np.arange(5), 2, shardable=False).as_numpy_iterator()]
    [[0, 1], [2, 3], [4]]
    """
    single = not isinstance(arrays, tuple)
    arrays = (arrays,) if single else arrays
    if shardable or any(tf.is_tensor(a) for a in arrays):
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA
        )
        dataset = tf.data.Dataset.from_tensor_slices(arrays[0] if single else arrays)
        return without_autotuning(dataset.batch(batch_size).with_options(options))
    arrays = tuple(np.asarray(a) for a in arrays)
    shapes = [tf.TensorShape([None, *a.shape[1:]]) for a in arrays]
    dtypes = [tf.as_dtype(a.dtype) for a in arrays]

    def sliced(index):
        start = index * batch_size
        return [a[start : start + batch_size] for a in arrays]

    def read(index):
        parts = tf.numpy_function(sliced, [index], dtypes, stateful=False)
        parts = [tf.ensure_shape(part, shape) for part, shape in zip(parts, shapes)]
        return parts[0] if single else tuple(parts)

    count = -(-len(arrays[0]) // batch_size)
    return without_autotuning(tf.data.Dataset.range(count).map(read))
