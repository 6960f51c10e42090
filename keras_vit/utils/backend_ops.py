"""The one product keras.ops lacks: 16-bit operands, float32 accumulation and result.

`keras.ops.matmul` returns its operands' dtype. Under a mixed precision policy that is
bfloat16 or float16, and XLA:CPU (TensorFlow's `jit_compile` and JAX) then computes the
product by converting both operands to float32: the bfloat16 units of CPUs with
AVX-512 BF16 or AMX are never used, and a float16 result can overflow. Each backend
can ask for a float32 result from 16-bit operands instead, each in its own words (JAX's
`preferred_element_type`, TensorFlow's `BatchMatMulV3(Tout=float32)` under XLA);
XLA:CPU hands such products to its bfloat16 kernels. Where a backend has no such
product, the operands are converted to float32 first, which is the same arithmetic:
products of 16-bit floats are exact in float32.

The gradient is computed the same way (16-bit operands, float32 products), so that
training gets the bfloat16 kernels too.
"""

import keras
from keras import ops


def _xla_compiling_tensorflow():
    # TensorFlow has the float32-output product only inside XLA clusters; its own
    # CPU kernels are not registered for it.
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph())


def _product(x1, x2):
    """`x1 @ x2` in float32 for 16-bit operands of equal dtype (batch dims equal)."""
    backend = keras.backend.backend()
    dtype = keras.backend.standardize_dtype(x1.dtype)
    if backend == "jax":
        import jax.numpy as jnp

        return jnp.matmul(x1, x2, preferred_element_type=jnp.float32)
    if backend == "tensorflow" and _xla_compiling_tensorflow():
        import tensorflow as tf

        return tf.raw_ops.BatchMatMulV3(x=x1, y=x2, Tout=tf.float32)
    if backend == "torch" and dtype == "bfloat16":
        # PyTorch's bfloat16 kernels accumulate in float32 and round the result to
        # bfloat16, whose range is float32's; converting the operands would forgo them.
        return ops.cast(ops.matmul(x1, x2), "float32")
    return ops.matmul(ops.cast(x1, "float32"), ops.cast(x2, "float32"))


@ops.custom_gradient
def _matmul_float32_16bit(x1, x2):
    def grad(*args, upstream=None):
        upstream = ops.cast(args[0] if upstream is None else upstream, x1.dtype)
        dx1 = _product(upstream, ops.swapaxes(x2, -1, -2))
        dx2 = _product(ops.swapaxes(x1, -1, -2), upstream)
        return ops.cast(dx1, x1.dtype), ops.cast(dx2, x2.dtype)

    return _product(x1, x2), grad


def matmul_float32(x1, x2):
    """`x1 @ x2` accumulated in float32 and returned in float32.

    For float32 operands it is `keras.ops.matmul`. Operands in bfloat16 or float16 (one
    dtype for both) are multiplied by the backend's 16-bit kernels where it has a float32
    result for them, and by float32 products of the converted operands elsewhere.

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
    dtype = keras.backend.standardize_dtype(x1.dtype)
    if dtype not in ("bfloat16", "float16"):
        return ops.matmul(ops.cast(x1, "float32"), ops.cast(x2, "float32"))
    x2 = ops.cast(x2, dtype)
    if len(x2.shape) == 2 and len(x1.shape) > 2:
        # As one (rows, k) matrix, so the kernel's gradient is a single product too.
        rows = ops.reshape(x1, (-1, x1.shape[-1]))
        product = _matmul_float32_16bit(rows, x2)
        return ops.reshape(product, (*ops.shape(x1)[:-1], x2.shape[-1]))
    return _matmul_float32_16bit(x1, x2)
