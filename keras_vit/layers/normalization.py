"""`LayerNormalization`: Keras' layer, with an export form and a lean training gradient."""

import keras
from keras import ops

from keras_vit.backend.eager import layer_norm
from keras_vit.backend.export import is_tracing_for_export
from keras_vit.utils.serialization import serializable


def _moments(x, axes, epsilon):
    """`x`'s mean over `axes`, `x` centred, and the reciprocal of its deviation."""
    mean = ops.mean(x, axis=axes, keepdims=True)
    centred = x - mean
    return mean, centred, ops.rsqrt(ops.mean(ops.square(centred), axis=axes, keepdims=True) + epsilon)


def _normalize(x, gamma, beta, epsilon, dtype):
    """Layer normalisation over the last axis, in float32, keeping for the backward
    pass only `x` and each row's mean and reciprocal deviation: differentiating
    the formula instead keeps three tensors of `x`'s size."""

    @ops.custom_gradient
    def normalize(x, gamma, beta):
        mean, centred, rstd = _moments(ops.cast(x, "float32"), [-1], epsilon)

        def grad(*args, upstream=None):
            upstream = ops.cast(args[0] if upstream is None else upstream, "float32")
            normalized = (ops.cast(x, "float32") - mean) * rstd
            rows = tuple(range(len(x.shape) - 1))
            scaled = upstream * gamma
            dx = rstd * (
                scaled
                - ops.mean(scaled, axis=-1, keepdims=True)
                - normalized * ops.mean(scaled * normalized, axis=-1, keepdims=True)
            )
            return (
                ops.cast(dx, x.dtype),
                ops.sum(upstream * normalized, axis=rows),
                ops.sum(upstream, axis=rows),
            )

        return ops.cast(centred * rstd * gamma + beta, dtype), grad

    return normalize(x, ops.cast(gamma, "float32"), ops.cast(beta, "float32"))


@serializable
class LayerNormalization(keras.layers.LayerNormalization):
    """`LayerNormalization` that exports everywhere and trains in less memory on JAX.

    When training under JAX its gradient is the closed form, computed from the inputs
    and each row's statistics, which XLA keeps instead of three tensors of the
    inputs' size (docs/performance.md: the memory of a training step).

    When `is_tracing_for_export()` it normalises with means, a subtraction and a
    reciprocal square root, in float32 as Keras does. On PyTorch Keras calls the fused
    `layer_norm` kernel with the normalised shape read from the input; Keras' ONNX
    exporter traces a variable batch size with TorchScript, which records those sizes
    as values of the traced input and then refuses them as the kernel's shape.

    Otherwise, over the last axis, it is `keras_vit.backend.eager.layer_norm`: Keras'
    numbers, without the Python of a keras.ops call on PyTorch.
    It keeps Keras' class name: a `.keras` file stores a model's layers under their
    class names, so the files written with Keras' layer load into this one.

    Args:
        Those of `keras.layers.LayerNormalization`.

    Returns:
        The normalised inputs, in the layer's compute dtype.

    Example:

    >>> from keras_vit.backend.export import tracing_for_export
    >>> x = keras.random.normal((2, 5, 8))
    >>> norm = LayerNormalization(epsilon=1e-6)
    >>> with tracing_for_export():
    ...     traced = norm(x)
    >>> bool(keras.ops.max(keras.ops.abs(traced - norm(x))) < 1e-5)
    True
    """

    def call(self, inputs, training=None):
        rank = len(inputs.shape)
        last_axis_only = [axis % rank for axis in self.axis] == [rank - 1]
        if (
            training  # at inference XLA keeps more buffers around the custom gradient
            # TensorFlow's XLA step and PyTorch's fused kernel need no more memory with
            # Keras' formula (docs/performance.md).
            and keras.backend.backend() == "jax"
            and last_axis_only
            and self.scale
            and self.center
            and not self.rms_scaling
        ):
            return _normalize(inputs, self.gamma, self.beta, self.epsilon, self.compute_dtype)
        if self.rms_scaling:
            return super().call(inputs)
        if not is_tracing_for_export():
            if last_axis_only:
                return layer_norm(inputs, self.gamma, self.beta, self.epsilon, self.compute_dtype)
            return super().call(inputs)
        x = ops.cast(inputs, "float32")
        rank = len(x.shape)
        axes = sorted(axis % rank for axis in self.axis)
        _, centred, rstd = _moments(x, axes, self.epsilon)
        x = centred * rstd
        for weight, combine in ((self.gamma, ops.multiply), (self.beta, ops.add)):
            if weight is not None:  # scale=False, center=False leave them out
                shape = [1] * rank
                for axis, size in zip(axes, weight.shape):
                    shape[axis] = size
                x = combine(x, ops.reshape(ops.cast(weight, "float32"), shape))
        return ops.cast(x, self.compute_dtype)
