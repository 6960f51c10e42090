"""Stochastic depth (`DropPath`): dropping a residual branch per sample."""

import keras
from keras import ops

from keras_vit.utils.checks import check_in_range
from keras_vit.utils.serialization import serializable


@serializable
class DropPath(keras.layers.Layer):
    """Stochastic depth: drops a residual branch per sample with probability `rate`.

    Kept samples are scaled by `1 / (1 - rate)`, so the expected output is unchanged.

    Example:

    >>> x = keras.ops.ones((4, 3, 8))
    >>> bool(keras.ops.all(DropPath(0.5)(x, training=False) == x))
    True
    """

    def __init__(self, rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        check_in_range("DropPath rate", rate, "[0, 1)")
        self.rate = float(rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, x, training=False):
        if not training or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        shape = (ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
        mask = keras.random.uniform(shape, seed=self.seed_generator, dtype=x.dtype) < keep
        return x * ops.cast(mask, x.dtype) / keep

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}
