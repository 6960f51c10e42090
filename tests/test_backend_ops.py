"""`keras_vit.backend` products, their gradients, `swapaxes`, `dense`, the `Dense` built on them,
PyTorch's 16-bit attention in training and the keras.ops forms of `eager`, on every backend
(tests/test_backends_*.py).

The reference is numpy in float64 on the same 16-bit values: products of 16-bit floats
are exact in float32, so the only differences allowed are float32 accumulation error
and, where the result is 16-bit, its rounding. Under XLA (JAX; TensorFlow inside
`jit_compile`) the optimized HLO shows whether the gradients' products stay on
XLA:CPU's 16-bit kernels.
"""

import re

import keras
import numpy as np
import pytest
from keras import ops

from keras_vit.backend import eager
from keras_vit.backend.attention import qkv_attention
from keras_vit.backend.products import dense, matmul_float32, swapaxes
from keras_vit.layers.dense import Dense
from keras_vit.layers.normalization import LayerNormalization

pytestmark = pytest.mark.gpu  # the accelerator subset (pyproject.toml's markers)

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


# (x1 shape, x2 shape, transpose_x2): batched products (attention: queries times keys
# transposed, weights times values) and a Dense layer's (rank-3 inputs, a matrix).
PRODUCTS = [
    ((2, 3, 5, 16), (2, 3, 16, 4), False),
    ((2, 3, 5, 16), (2, 3, 4, 16), True),
    ((2, 5, 16), (16, 4), False),
    ((2, 5, 16), (4, 16), True),
]


def _exact_product_and_gradients(x1, x2, transpose_x2, upstream):
    """`x1 @ x2` (x2 transposed) and the gradients of `sum(upstream * product)`, float64."""
    x2t = np.swapaxes(x2, -1, -2) if transpose_x2 else x2
    dx1 = upstream @ np.swapaxes(x2t, -1, -2)
    dx2t = np.swapaxes(x1, -1, -2) @ upstream
    if x2.ndim < x1.ndim:  # x2 is shared by all the leading dimensions
        dx2t = dx2t.reshape(-1, *dx2t.shape[-2:]).sum(0)
    return x1 @ x2t, dx1, np.swapaxes(dx2t, -1, -2) if transpose_x2 else dx2t


@pytest.mark.parametrize("x1_shape, x2_shape, transpose_x2", PRODUCTS)
def test_product_and_gradients_equal_the_exact_ones(x1_shape, x2_shape, transpose_x2):
    rng = np.random.default_rng(1)
    a = _rounded(rng.normal(size=x1_shape), "bfloat16")
    b = _rounded(rng.normal(size=x2_shape), "bfloat16")
    product = matmul_float32(a.astype("float32"), b.astype("float32"), transpose_x2)
    upstream = _rounded(rng.normal(size=product.shape), "bfloat16")
    expected = _exact_product_and_gradients(a, b, transpose_x2, upstream)

    def loss(x, y):
        product = matmul_float32(ops.cast(x, "bfloat16"), ops.cast(y, "bfloat16"), transpose_x2)
        return ops.sum(ops.multiply(product, upstream.astype("float32"))), product

    for value, grads in _run(_gradients(loss), a.astype("float32"), b.astype("float32")):
        assert keras.backend.standardize_dtype(value.dtype) == "float32"
        # Float32 accumulation of exact products: 16 terms, each rounding at most 2**-24.
        np.testing.assert_allclose(ops.convert_to_numpy(value), expected[0], rtol=0, atol=2**-16)
        for grad, want in zip(grads, expected[1:]):
            # Gradients come back in the operands' dtype (bfloat16), cast to float32.
            np.testing.assert_allclose(ops.convert_to_numpy(grad), want, rtol=2**-7, atol=2**-7)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("axes", [(1, 2), (-1, -2), (0, 3), (2, -1)])
def test_swapaxes_and_its_gradient_equal_numpys(dtype, axes):
    rng = np.random.default_rng(5)
    x = _rounded(rng.normal(size=(2, 3, 4, 5)), dtype)
    weights = _rounded(rng.normal(size=np.swapaxes(x, *axes).shape), dtype)

    def loss(x, y):
        swapped = swapaxes(ops.cast(x, dtype), *axes)
        return ops.sum(ops.cast(swapped, "float32") * y), swapped

    runs = _run(_gradients(loss), x.astype("float32"), weights.astype("float32"))
    for swapped, (grad, _) in runs:
        # A permutation: exact, in the input's dtype, and so is its gradient.
        assert keras.backend.standardize_dtype(swapped.dtype) == dtype
        np.testing.assert_array_equal(_rounded(swapped, "float32"), np.swapaxes(x, *axes))
        np.testing.assert_array_equal(ops.convert_to_numpy(grad), np.swapaxes(weights, *axes))


def test_dense_bias_and_its_gradients_equal_the_exact_ones():
    rng = np.random.default_rng(6)
    x = _rounded(rng.normal(size=(3, 40, 8)), "bfloat16")
    bias = _rounded(rng.normal(size=(8,)), "bfloat16")
    upstream = _rounded(rng.normal(size=x.shape), "bfloat16")
    identity = ops.eye(8, dtype="bfloat16")  # so the product is x, exactly

    def loss(x, b):
        total = dense(ops.cast(x, "bfloat16"), identity, ops.cast(b, "bfloat16"))
        return ops.sum(ops.multiply(ops.cast(total, "float32"), upstream.astype("float32"))), total

    runs = _run(_gradients(loss), x.astype("float32"), bias.astype("float32"))
    for index, (total, (dx, dbias)) in enumerate(runs):
        assert keras.backend.standardize_dtype(total.dtype) == "bfloat16"
        # The sum rounded once to bfloat16; the inputs' gradient is the upstream as is.
        np.testing.assert_allclose(_rounded(total, "float32"), x + bias, rtol=2**-8, atol=0)
        np.testing.assert_array_equal(_rounded(dx, "float32"), upstream)
        want = upstream.sum(axis=(0, 1))
        error = np.abs(_rounded(dbias, "float32") - want)
        if BACKEND == "jax" or index == 1:  # under XLA: 120 terms summed in float32,
            # then rounded to bfloat16 once
            assert np.all(error <= 2**-8 * np.abs(want) + 2**-16), error
        else:  # the backend's own sum, accumulated in bfloat16
            assert np.all(error <= 2 * 2**-8 * np.abs(upstream).sum(axis=(0, 1))), error


def _dot_operand_dtypes(hlo):
    """`(lhs, rhs)` element types of every matrix product in an optimized HLO module's
    text: its dots, and on GPUs the cuBLAS calls that XLA may make of them."""
    pairs = []
    for computation in re.split(r"\n(?=\S)", hlo):
        types = dict(re.findall(r"%(\S+) = (\w+)\[", computation))
        products = re.findall(r" dot\(%([^,\s]+), %([^,\s)]+)\)", computation)
        products += re.findall(
            r" custom-call\(%([^,\s]+), %([^,\s)]+)\), custom_call_target=\"__cublas", computation
        )
        pairs += [(types[lhs], types[rhs]) for lhs, rhs in products]
    return pairs


def _optimized_hlo(function, *args):
    if BACKEND == "jax":
        import jax

        return jax.jit(function).lower(*args).compile().as_text()
    import tensorflow as tf

    compiled = tf.function(function, jit_compile=True)
    return compiled.experimental_get_compiler_ir(*args)(stage="optimized_hlo")


@pytest.mark.skipif(BACKEND == "torch", reason="PyTorch runs its own kernels, not XLA's")
@pytest.mark.parametrize("x1_shape, x2_shape, transpose_x2", PRODUCTS)
def test_gradient_products_stay_on_the_16bit_kernels(x1_shape, x2_shape, transpose_x2):
    rng = np.random.default_rng(4)
    a = rng.normal(size=x1_shape).astype("float32")
    b = rng.normal(size=x2_shape).astype("float32")
    def product(x, y):
        return matmul_float32(ops.cast(x, "bfloat16"), ops.cast(y, "bfloat16"))

    forward = _dot_operand_dtypes(
        _optimized_hlo(product, a, np.swapaxes(b, -1, -2) if transpose_x2 else b)
    )
    if forward != [("bf16", "bf16")]:
        pytest.skip(f"XLA has no bfloat16 product on this device (dots {forward})")
    # A random upstream gradient, as in training, not ops.sum's constant one, whose products
    # XLA may simplify. With both changes (and cuBLAS calls counted) the test passed on an
    # H200, where it had found two products of three.
    upstream = rng.normal(size=np.matmul(a, np.swapaxes(b, -1, -2) if transpose_x2 else b).shape)

    def loss(x, y):
        product = matmul_float32(ops.cast(x, "bfloat16"), ops.cast(y, "bfloat16"), transpose_x2)
        return ops.sum(product * upstream.astype("float32")), product

    dots = _dot_operand_dtypes(_optimized_hlo(_gradients(loss), a, b))
    # The product and both gradients, none from float32 copies of the operands.
    assert dots == [("bf16", "bf16")] * 3


def _gradients(loss):
    """`(x, y) -> (aux, (dloss/dx, dloss/dy))` in this backend's autodiff, for a `loss`
    that returns `(loss, aux)`."""
    if BACKEND == "jax":
        import jax

        def gradients(x, y):
            grads, aux = jax.grad(loss, argnums=(0, 1), has_aux=True)(x, y)
            return aux, grads

        return gradients
    if BACKEND == "tensorflow":
        import tensorflow as tf

        def gradients(x, y):
            x, y = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
            with tf.GradientTape() as tape:
                tape.watch([x, y])
                value, aux = loss(x, y)
            return aux, tuple(tape.gradient(value, [x, y]))

        return gradients

    def gradients(x, y):
        # Leaves on the device Keras computes on (a GPU where there is one).
        x, y = (ops.convert_to_tensor(t).requires_grad_() for t in (x, y))
        value, aux = loss(x, y)
        value.backward()
        return aux.detach(), (x.grad.detach(), y.grad.detach())

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
        # the compute dtype and rounded again; under XLA the sum rounded once.
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


def _attention_and_gradients(q, k, v, upstream):
    """Softmax attention `(batch, tokens, heads, head_dim)` in float64 numpy, and the
    gradients of `sum(output * upstream)` with respect to q, k and v."""
    scale = 1 / np.sqrt(q.shape[-1])
    logits = np.einsum("btnh,bsnh->bnts", q, k) * scale
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = np.einsum("bnts,bsnh->btnh", weights, v)
    d_weights = np.einsum("btnh,bsnh->bnts", upstream, v)
    d_logits = weights * (d_weights - (d_weights * weights).sum(-1, keepdims=True)) * scale
    dq = np.einsum("bnts,bsnh->btnh", d_logits, k)
    dk = np.einsum("bnts,btnh->bsnh", d_logits, q)
    dv = np.einsum("bnts,btnh->bsnh", weights, upstream)
    return out, (dq, dk, dv)


def test_qkv_attention_is_softmax_attention_of_the_stacked_parts():
    # Against float64 NumPy, with a mask that leaves each query some keys.
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(2, 7, 3, 8)).astype("float32") for _ in range(3))
    want, _ = _attention_and_gradients(q, k, v, np.zeros_like(q))
    got = ops.convert_to_numpy(qkv_attention(ops.convert_to_tensor(np.stack([q, k, v], axis=2))))
    np.testing.assert_allclose(got, want.reshape(2, 7, 24), rtol=1e-5, atol=1e-5)
    keys = np.arange(7) < 5  # the last two keys masked out
    want, _ = _attention_and_gradients(q, k[:, :5], v[:, :5], np.zeros_like(q))
    mask = ops.convert_to_tensor(np.broadcast_to(keys, (2, 1, 7, 7)))
    got = qkv_attention(ops.convert_to_tensor(np.stack([q, k, v], axis=2)), mask)
    np.testing.assert_allclose(ops.convert_to_numpy(got), want.reshape(2, 7, 24),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(BACKEND != "torch", reason="the float32 path is PyTorch's, for training on a CPU")
def test_16bit_attention_trains_in_float32_and_rounds_once():
    # Training takes the float32 kernel: the output and each gradient are the exact values
    # rounded to bfloat16 once (within a unit roundoff, 2**-8, plus float32's error).
    import torch

    rng = np.random.default_rng(8)
    q, k, v, upstream = (_rounded(rng.normal(size=(2, 33, 3, 16)), "bfloat16") for _ in range(4))
    want_out, want_grads = _attention_and_gradients(q, k, v, upstream)
    with keras.device("cpu"):  # also where Keras computes on a GPU
        qkv = torch.tensor(np.stack([q, k, v], axis=2), dtype=torch.bfloat16, requires_grad=True)
        out = qkv_attention(qkv)
        out.backward(torch.tensor(upstream.reshape(2, 33, 48), dtype=torch.bfloat16))
        got = (out.unflatten(2, (3, 16)), *qkv.grad.unbind(2))
        for got, want in zip(got, (want_out, *want_grads)):
            assert got.dtype == torch.bfloat16
            error = np.abs(got.detach().float().numpy() - want)
            assert np.all(error <= 2**-8 * np.abs(want) + 1e-5 * np.abs(want).max()), error.max()
        # Inference keeps the 16-bit kernel.
        with torch.no_grad():
            assert qkv_attention(qkv).dtype == torch.bfloat16


@pytest.mark.parametrize("policy", [
    "float32", "mixed_bfloat16",
    pytest.param("float64", marks=pytest.mark.skipif(
        BACKEND == "jax", reason="JAX computes in float32 unless x64 is enabled")),
])
def test_layer_norm_is_keras_layer_norm_to_the_bit(policy):
    # `LayerNormalization` over the last axis is `eager.layer_norm` (PyTorch's kernel called
    # directly there): Keras' own layer with the same weights gives the same numbers, and
    # both are float64 NumPy's normalisation within the compute dtype's rounding.
    rng = np.random.default_rng(12)
    x = (rng.normal(size=(2, 5, 16)) * 3 + 1).astype("float32")
    gamma, beta = rng.normal(size=16).astype("float32"), rng.normal(size=16).astype("float32")
    outputs = []
    for layer in (LayerNormalization(epsilon=1e-6, dtype=policy),
                  keras.layers.LayerNormalization(epsilon=1e-6, dtype=policy)):
        layer.build(x.shape)
        layer.set_weights([gamma, beta])
        # Inputs in float32 and in the compute dtype (a block's tokens under a mixed policy).
        y = [layer(inputs) for inputs in (x, ops.cast(x, layer.compute_dtype))]
        assert keras.backend.standardize_dtype(y[1].dtype) == layer.compute_dtype
        outputs.append(np.asarray([ops.convert_to_numpy(ops.cast(v, "float64")) for v in y]))
    np.testing.assert_array_equal(outputs[0], outputs[1])
    rows = _rounded(x, layer.compute_dtype)
    centred = rows - rows.mean(-1, keepdims=True)
    want = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-6) * gamma + beta
    tolerance = 2**-7 if policy == "mixed_bfloat16" else 1e-5
    for got in outputs[0]:
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance * 4)


def test_eager_ops_are_keras_ops_to_the_bit():
    # Each function of `eager` against the keras.ops call it stands for, and against
    # float64 NumPy where there is a closed form.
    from math import erf, sqrt, tanh, pi

    x = np.linspace(-5, 5, 201).reshape(3, 67).astype("float32")
    for approximate in (False, True):
        got = ops.convert_to_numpy(eager.gelu(ops.convert_to_tensor(x), approximate=approximate))
        want = ops.convert_to_numpy(keras.activations.gelu(ops.convert_to_tensor(x), approximate))
        np.testing.assert_array_equal(got, want)
        exact = [
            0.5 * v * (1 + (tanh(sqrt(2 / pi) * (v + 0.044715 * v**3)) if approximate
                            else erf(v / sqrt(2))))
            for v in x.astype("float64").ravel()
        ]
        np.testing.assert_allclose(got.ravel(), exact, rtol=1e-6, atol=1e-6)
    tokens = np.arange(2 * 5 * 24, dtype="float32").reshape(2, 5, 24)
    split = eager.split_last_axis(ops.convert_to_tensor(tokens), (3, 2, 4))
    np.testing.assert_array_equal(ops.convert_to_numpy(split), tokens.reshape(2, 5, 3, 2, 4))
    variable = keras.Variable(x)
    for value in (variable, ops.convert_to_tensor(x), x):
        np.testing.assert_array_equal(ops.convert_to_numpy(eager.as_tensor(value)), x)
    tensor = ops.convert_to_tensor(x)
    if BACKEND == "torch":  # a tensor is returned as it is
        assert eager.as_tensor(tensor) is tensor
