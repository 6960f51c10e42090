"""Products that keras.ops lacks or computes slower than the backend can.

`keras.ops.matmul` returns its operands' dtype. Under a mixed precision policy that is
bfloat16 or float16, and XLA:CPU (JAX, and TensorFlow under `jit_compile`) then
computes the product from float32 copies of both operands: the bfloat16 units of CPUs
with AVX-512 BF16 or AMX go unused. Both can ask for a float32 result from 16-bit
operands instead (JAX's `preferred_element_type`, TensorFlow's
`BatchMatMulV3(Tout=float32)`), which XLA:CPU hands to its bfloat16 kernels, and its
gradient is computed the same way here. `matmul` gives keras.ops.matmul's result from
them, `matmul_float32` a float32 one (attention logits: a float16 result overflows,
a bfloat16 one keeps 8 bits). Elsewhere both are computed as keras.ops computes them.

On PyTorch, `dense` asks for the product and the bias in one call (`addmm`, which adds
the bias inside the product's output pass instead of a second pass over the output) and
`dot_product_attention` hands PyTorch's fused attention the strided query, key and value
that it reads in place, where `keras.ops.dot_product_attention` copies them to
contiguous tensors first (and its output back). Elsewhere both are the keras.ops forms.
"""

import keras
from keras import ops


def _xla_compiling_tensorflow():
    # TensorFlow has the float32-output product only inside XLA clusters; its own
    # CPU kernels are not registered for it.
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph())


def _xla_float32_product_available():
    """Whether this backend, here, has a float32 product of 16-bit operands that
    reaches XLA:CPU's bfloat16 kernels."""
    backend = keras.backend.backend()
    return backend == "jax" or (backend == "tensorflow" and _xla_compiling_tensorflow())


def _product(x1, x2, transpose_x2=False):
    """`x1 @ x2` (`x1 @ swapaxes(x2)` if `transpose_x2`) in float32, for 16-bit operands
    of equal dtype and equal batch dimensions.

    The transposed product is asked for as such (an einsum, `adj_y`): XLA:CPU hands it
    to its bfloat16 kernels, but converts the operands of a transpose followed by a
    product to float32.
    """
    if keras.backend.backend() == "jax":
        import jax.numpy as jnp

        if transpose_x2:
            return jnp.einsum("...mk,...nk->...mn", x1, x2, preferred_element_type=jnp.float32)
        return jnp.matmul(x1, x2, preferred_element_type=jnp.float32)
    import tensorflow as tf

    return tf.raw_ops.BatchMatMulV3(x=x1, y=x2, adj_y=transpose_x2, Tout=tf.float32)


@ops.custom_gradient
def _xla_float32_product(x1, x2):
    def grad(*args, upstream=None):
        upstream = ops.cast(args[0] if upstream is None else upstream, x1.dtype)
        dx1 = _product(upstream, x2, transpose_x2=True)
        dx2 = _product(ops.swapaxes(x1, -1, -2), upstream)
        return ops.cast(dx1, x1.dtype), ops.cast(dx2, x2.dtype)

    return _product(x1, x2), grad


def _float32_product(x1, x2):
    """`x1 @ x2` in float32 by XLA's 16-bit kernels, for 16-bit operands of one
    dtype where `_xla_float32_product_available()`."""
    x2 = ops.cast(x2, x1.dtype)
    if len(x2.shape) == 2 and len(x1.shape) > 2:
        # As one (rows, k) matrix, so the kernel's gradient is a single product too.
        rows = ops.reshape(x1, (-1, x1.shape[-1]))
        product = _xla_float32_product(rows, x2)
        return ops.reshape(product, (*ops.shape(x1)[:-1], x2.shape[-1]))
    return _xla_float32_product(x1, x2)


def _is_16bit(x):
    return keras.backend.standardize_dtype(x.dtype) in ("bfloat16", "float16")


def matmul_float32(x1, x2):
    """`x1 @ x2` accumulated in float32 and returned in float32.

    Float32 operands give `keras.ops.matmul`. Operands in bfloat16 or float16 (one dtype
    for both) are multiplied by XLA's 16-bit kernels where it has a float32 result for
    them (JAX; TensorFlow inside `jit_compile`), and as float32 copies elsewhere: the
    same numbers, since products of 16-bit floats are exact in float32.

    Args:
        x1: `(..., m, k)` tensor; a rank above that of `x2`, with `x2` of rank 2,
            multiplies every `(m, k)` matrix of `x1` by `x2` (a Dense layer's product).
        x2: `(..., k, n)` tensor with the same leading dimensions as `x1`, or `(k, n)`.

    Returns:
        The `(..., m, n)` float32 product.

    Example:

    >>> a = keras.ops.ones((2, 3, 4), dtype="bfloat16")
    >>> b = keras.ops.full((4, 5), 1000.0, dtype="bfloat16")
    >>> product = matmul_float32(a, b)
    >>> keras.backend.standardize_dtype(product.dtype), float(product[0, 0, 0])
    ('float32', 4000.0)
    """
    if _is_16bit(x1) and _xla_float32_product_available():
        return _float32_product(x1, x2)
    return ops.matmul(ops.cast(x1, "float32"), ops.cast(x2, "float32"))


def matmul(x1, x2):
    """`keras.ops.matmul(x1, x2)`, with 16-bit operands on XLA's 16-bit kernels.

    The result is the operands' dtype, rounded once from a float32 accumulation, as
    `keras.ops.matmul` computes it on every backend; under XLA (JAX; TensorFlow inside
    `jit_compile`) it comes from the float32 product of `matmul_float32` rather than
    from float32 copies of the operands. Elsewhere it is `keras.ops.matmul` (PyTorch's
    and TensorFlow's own kernels already use the CPU's bfloat16 units).

    Example:

    >>> a = keras.ops.ones((2, 3, 4), dtype="bfloat16")
    >>> b = keras.ops.ones((4, 5), dtype="bfloat16")
    >>> keras.backend.standardize_dtype(matmul(a, b).dtype)
    'bfloat16'
    """
    if _is_16bit(x1) and _xla_float32_product_available():
        return ops.cast(_float32_product(x1, x2), x1.dtype)
    return ops.matmul(x1, x2)


def dense(inputs, kernel, bias=None):
    """`inputs @ kernel + bias`: `keras.layers.Dense`'s product, without its activation.

    The product is `matmul`'s. On PyTorch, in float32, it is one
    `torch.nn.functional.linear` call (`addmm`), which adds the bias as it writes the
    product: the same numbers as the product followed by the addition, with one pass
    over the output fewer. 16-bit operands keep the product and the addition as
    `keras.layers.Dense` computes them (two roundings; `addmm` would round once).

    Args:
        inputs: `(..., k)` tensor.
        kernel: `(k, n)` tensor or variable.
        bias: `(n,)` tensor or variable, or None.

    Returns:
        The `(..., n)` tensor, in the dtype of `inputs`.

    Example:

    >>> x = keras.ops.ones((2, 3, 4))
    >>> y = dense(x, keras.ops.ones((4, 5)), keras.ops.arange(5, dtype="float32"))
    >>> tuple(y.shape), keras.ops.convert_to_numpy(y[0, 0]).tolist()
    ((2, 3, 5), [4.0, 5.0, 6.0, 7.0, 8.0])
    """
    if keras.backend.backend() == "torch":
        import torch

        # Variables read as their values here (cast to the compute dtype under a
        # mixed policy), so the dtypes checked are those multiplied.
        operands = [ops.convert_to_tensor(x) for x in (inputs, kernel, bias) if x is not None]
        if all(x.dtype == torch.float32 for x in operands):
            # linear takes torch.nn.Linear's (n, k) weight: the kernel's transpose, a
            # view that addmm reads back as the (k, n) kernel.
            inputs, kernel, *rest = operands
            return torch.nn.functional.linear(inputs, kernel.T, *rest)
    x = matmul(inputs, kernel)
    return x if bias is None else ops.add(x, bias)


def dot_product_attention(query, key, value):
    """`keras.ops.dot_product_attention(query, key, value)`: softmax attention scaled
    by `1 / sqrt(head_dim)`, without mask or bias, in the `(batch, tokens, heads,
    head_dim)` layout.

    On PyTorch it calls `torch.nn.functional.scaled_dot_product_attention` on the
    `(batch, heads, tokens, head_dim)` views of its arguments, as keras.ops does, but
    without making them contiguous first: the same kernel on the same numbers, reading
    slices of a fused q|k|v projection in place. Its output comes back in the layout
    of the query, so the returned `(batch, tokens, heads, head_dim)` view of it is
    contiguous when the query's tokens are outside its heads.

    Args:
        query, key, value: `(batch, tokens, heads, head_dim)` tensors of one dtype
            (key and value may have another number of tokens).

    Returns:
        The `(batch, tokens, heads, head_dim)` attention output.

    Example:

    >>> q = keras.random.normal((2, 5, 3, 8), seed=0)
    >>> out = dot_product_attention(q, q, q)
    >>> tuple(out.shape)
    (2, 5, 3, 8)
    """
    if keras.backend.backend() != "torch":
        return ops.dot_product_attention(query, key, value)
    import torch

    query, key, value = (ops.convert_to_tensor(x).transpose(1, 2) for x in (query, key, value))
    return torch.nn.functional.scaled_dot_product_attention(query, key, value).transpose(1, 2)
