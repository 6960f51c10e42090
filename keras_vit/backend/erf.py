"""The error function as a rational polynomial, for XLA consumers that cannot load
JAX's `lax.erf` (jax2tf export)."""

import math

import keras
from keras import ops

# erf(x) = x * P(x^2) / Q(x^2) for |x| <= ERF_CLIP, and +-1 beyond, where float32
# rounds it to +-1 anyway. Fitted for this package by weighted least squares with
# Lawson reweighting towards the minimax fit on Chebyshev nodes; evaluated in float32
# it is as close to erf as XLA's own.
ERF_CLIP = 3.92
_ERF_P = (
    1.1283791807870855, 0.18470204003542848, 0.05427829350527862, 0.0038323929470468663,
    0.00038036490439347727, 4.7176154149366e-06, -1.3335082939410789e-08,
)
_ERF_Q = (
    1.0, 0.4970214493101046, 0.11377579631297821, 0.015430951654451401,
    0.0013050234227493269, 6.341723936241545e-05,
)


def _horner(coefficients, t):
    value = ops.cast(coefficients[-1], t.dtype)
    for coefficient in coefficients[-2::-1]:
        value = value * t + coefficient
    return value


@ops.custom_gradient
def erf(x):
    """The error function from multiplies, adds and one divide (float32 inside).

    Every XLA consumer loads it (unlike JAX's `lax.erf` composite, which jax2tf
    export cannot hand to TensorFlow) and XLA fuses it with its neighbours. The
    gradient is the closed form, which needs only `x` kept for the backward pass.

    Example:

    >>> round(float(erf(keras.ops.convert_to_tensor(0.5))), 6)
    0.5205
    """
    dtype = keras.backend.standardize_dtype(x.dtype)
    # 16-bit floats would round every Horner step; XLA's erf also upcasts them.
    x32 = ops.cast(x, "float32")
    clipped = ops.clip(x32, -ERF_CLIP, ERF_CLIP)
    t = clipped * clipped
    numerator, denominator = (_horner(coefficients, t) for coefficients in (_ERF_P, _ERF_Q))

    def grad(*args, upstream=None):
        upstream = args[0] if upstream is None else upstream
        slope = ops.exp(-x32 * x32) * (2.0 / math.sqrt(math.pi))
        return upstream * ops.cast(slope, dtype)

    return ops.cast(clipped * numerator / denominator, dtype), grad
