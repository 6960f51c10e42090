"""`backend_ops` products and the `Dense` built on them, on every backend
(tests/test_backends.py).

The reference is numpy in float64 on the same 16-bit values: products of 16-bit floats
are exact in float32, so the only differences allowed are float32 accumulation error
and, where the result is 16-bit, its rounding.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_vit.models.layers import Dense
from keras_vit.utils.backend_ops import matmul_float32

BACKEND = keras.backend.backend()


def _rounded(values, dtype):
    """`values` rounded to `dtype`, as float64 numpy."""
    return np.asarray(ops.convert_to_numpy(ops.cast(ops.cast(values, dtype), "float32")), "float64")


def _run(function, *args):
    """`function(*args)`, and on TensorFlow also inside an XLA-compiled function,
    where the 16-bit product differs from the eager one."""
    results = [function(*args)]
    if BACKEND == "tensorflow":
        import tensorflow as tf

        results.append(tf.function(function, jit_compile=True)(*args))
    return results


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_product_is_float32_and_equals_the_exact_product(dtype):
    rng = np.random.default_rng(0)
    # Entries near 300: products reach 300 * 300 * 24 ~ 2e6, past float16's 65504.
    a = rng.uniform(200, 300, (2, 5, 24)).astype("float32")
    b = rng.uniform(200, 300, (24, 7)).astype("float32")
    expected = _rounded(a, dtype) @ _rounded(b, dtype)
    assert np.abs(expected).max() > 65504  # the float16 result would overflow
    for product in _run(lambda x, y: matmul_float32(ops.cast(x, dtype), ops.cast(y, dtype)), a, b):
        assert keras.backend.standardize_dtype(product.dtype) == "float32"
        product = ops.convert_to_numpy(product)
        assert np.all(np.isfinite(product))
        np.testing.assert_allclose(product, expected, rtol=2.0**-18, atol=0)


def test_batched_product_and_gradient_equal_float32_ones():
    rng = np.random.default_rng(1)
    a = _rounded(rng.normal(size=(2, 3, 5, 16)), "bfloat16").astype("float32")
    b = _rounded(rng.normal(size=(2, 3, 16, 4)), "bfloat16").astype("float32")
    upstream = _rounded(rng.normal(size=(2, 3, 5, 4)), "bfloat16").astype("float32")
    # d(sum(upstream * a @ b)) / da = upstream @ b^T, / db = a^T @ upstream.
    expected = (upstream @ np.swapaxes(b, -1, -2), np.swapaxes(a, -1, -2) @ upstream)

    def loss(x, y):
        product = matmul_float32(ops.cast(x, "bfloat16"), ops.cast(y, "bfloat16"))
        return ops.sum(ops.multiply(product, upstream))

    for grads in _run(_gradients(loss), a, b):
        for grad, want in zip(grads, expected):
            # Gradients come back in the operands' dtype (bfloat16), cast to float32.
            np.testing.assert_allclose(ops.convert_to_numpy(grad), want, rtol=2**-7, atol=2**-7)


def _gradients(loss):
    """`(x, y) -> (dloss/dx, dloss/dy)` in this backend's autodiff."""
    if BACKEND == "jax":
        import jax

        return jax.grad(loss, argnums=(0, 1))
    if BACKEND == "tensorflow":
        import tensorflow as tf

        def gradients(x, y):
            x, y = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
            with tf.GradientTape() as tape:
                tape.watch([x, y])
                value = loss(x, y)
            return tape.gradient(value, [x, y])

        return gradients
    import torch

    def gradients(x, y):
        x = torch.tensor(x, requires_grad=True)
        y = torch.tensor(y, requires_grad=True)
        loss(x, y).backward()
        return x.grad.detach(), y.grad.detach()

    return gradients


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_dense_rounds_the_float32_product(policy):
    compute = policy.split("_")[1]
    unit = 2.0**-8 if compute == "bfloat16" else 2.0**-11  # the unit roundoff
    rng = np.random.default_rng(2)
    inputs = rng.normal(size=(3, 4, 16)).astype("float32")
    layer = Dense(8, dtype=policy)
    layer.build(inputs.shape)
    layer.kernel.assign(rng.normal(size=(16, 8)))
    layer.bias.assign(rng.normal(size=(8,)))
    product = _rounded(inputs, compute) @ _rounded(layer.kernel, compute)
    expected = product + _rounded(layer.bias, compute)
    for outputs in _run(layer, inputs):
        assert keras.backend.standardize_dtype(outputs.dtype) == compute
        # As keras.layers.Dense: the product rounded once, then the bias added in
        # the compute dtype and rounded again.
        outputs = np.asarray(ops.convert_to_numpy(ops.cast(outputs, "float32")), "float64")
        bound = 1.01 * unit * (np.abs(product) + np.abs(expected)) + 1e-6
        assert np.all(np.abs(outputs - expected) <= bound), np.abs(outputs - expected).max()


def test_float32_dense_is_keras_dense():
    rng = np.random.default_rng(3)
    inputs = rng.normal(size=(3, 16)).astype("float32")
    ours, theirs = Dense(8), keras.layers.Dense(8)
    ours.build(inputs.shape)
    theirs.build(inputs.shape)
    theirs.set_weights(ours.get_weights())
    np.testing.assert_array_equal(
        ops.convert_to_numpy(ours(inputs)), ops.convert_to_numpy(theirs(inputs))
    )
