"""Products that keras.ops lacks or computes slower than the backend can.

`keras.ops.matmul` returns its operands' dtype. Under a mixed precision policy that is
bfloat16 or float16, and XLA:CPU (JAX, and TensorFlow under `jit_compile`) then
computes the product from float32 copies of both operands: the bfloat16 units of CPUs
with AVX-512 BF16 or AMX go unused. Both can ask for a float32 result from 16-bit
operands instead (JAX's `preferred_element_type`, TensorFlow's
`BatchMatMulV3(Tout=float32)`), which XLA:CPU hands to its bfloat16 kernels, but only
in their own forms: the left operand contracted over its last axis, the right one over
either of its last two (`a @ b`, and `a @ swapaxes(b)` asked for as such), each read as
it lies in memory. A product that would read a transposed operand (`swapaxes(a) @ b`, or
a transpose that XLA folds in) is computed from float32 copies. So the gradients here
are asked for in those forms too, with the transposes they need made copies of their
own (`swapaxes`). `matmul` gives keras.ops.matmul's result from them,
`matmul_float32` a float32 one, also of `x1` and a transposed `x2` (attention logits: a
float16 result overflows, a bfloat16 one keeps 8 bits), `dense` adds a bias to it
before rounding. Elsewhere all are computed as keras.ops computes them.

On PyTorch, `dense` asks for the product and the bias in one call (`addmm`, which adds
the bias inside the product's output pass instead of a second pass over the output);
elsewhere it is the keras.ops form.
"""

import keras
from keras import ops

from keras_vit.backend.eager import as_tensor


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


def swapaxes(x, axis1, axis2):
    """`keras.ops.swapaxes(x, axis1, axis2)`, kept out of XLA's 16-bit products.

    XLA:CPU folds a transpose into the product that reads it, directly or through
    elementwise ops; the product then reads a transposed operand, and XLA:CPU computes
    it from float32 copies of both operands (`swapaxes(a) @ b`, or a product of the
    gradient of attention outputs moved from tokens-first to heads-first). With 16-bit `x` under
    XLA (JAX; TensorFlow inside `jit_compile`) the axes are swapped through a unit
    axis, `(.., a, .., 1, b, ..)` to `(.., b, .., 1, a, ..)`, then reshaped: XLA
    computes that as a copy of its own, in either direction of autodiff, and the
    products next to it stay on the bfloat16 kernels. Elsewhere it is
    `keras.ops.swapaxes`; the values are the same everywhere.

    Args:
        x: a tensor.
        axis1, axis2: the two axes to swap (negative ones count from the end).

    Returns:
        `x` with `axis1` and `axis2` swapped.

    Example:

    >>> x = keras.ops.reshape(keras.ops.arange(6, dtype="bfloat16"), (1, 2, 3))
    >>> keras.ops.convert_to_numpy(keras.ops.cast(swapaxes(x, 1, 2), "int32"))[0].tolist()
    [[0, 3], [1, 4], [2, 5]]
    """
    if not (_is_16bit(x) and _xla_float32_product_available()):
        return ops.swapaxes(x, axis1, axis2)
    rank = len(x.shape)
    first, second = sorted(axis % rank for axis in (axis1, axis2))
    shape = list(ops.shape(x))
    shape[first], shape[second] = shape[second], shape[first]
    order = list(range(rank + 1))
    order[first], order[second + 1] = second + 1, first
    moved = ops.transpose(ops.expand_dims(x, second), order)
    return ops.reshape(moved, shape)


def _upstream(args, upstream, dtype):
    # Keras hands `grad` the output gradient positionally or as `upstream`, by backend.
    return ops.cast(args[0] if upstream is None else upstream, dtype)


@ops.custom_gradient
def _xla_float32_product(x1, x2):
    # x1 @ x2; gradients upstream @ swapaxes(x2) and swapaxes(x1) @ upstream.
    def grad(*args, upstream=None):
        upstream = _upstream(args, upstream, x1.dtype)
        dx1 = _product(upstream, x2, transpose_x2=True)
        dx2 = _product(swapaxes(x1, -2, -1), upstream)
        return ops.cast(dx1, x1.dtype), ops.cast(dx2, x2.dtype)

    return _product(x1, x2), grad


@ops.custom_gradient
def _xla_float32_product_transposed(x1, x2):
    # x1 @ swapaxes(x2); gradients upstream @ x2 and swapaxes(upstream) @ x1.
    def grad(*args, upstream=None):
        upstream = _upstream(args, upstream, x1.dtype)
        dx1 = _product(upstream, x2)
        dx2 = _product(swapaxes(upstream, -2, -1), x1)
        return ops.cast(dx1, x1.dtype), ops.cast(dx2, x2.dtype)

    return _product(x1, x2, transpose_x2=True), grad


def _float32_product(x1, x2, transpose_x2=False):
    """`x1 @ x2` (`x1 @ swapaxes(x2)` if `transpose_x2`) in float32 by XLA's 16-bit
    kernels, for 16-bit operands of one dtype where `_xla_float32_product_available()`."""
    x2 = ops.cast(x2, x1.dtype)
    product = _xla_float32_product_transposed if transpose_x2 else _xla_float32_product
    return _over_rows(product, x1, x2)


def _over_rows(product, x1, x2):
    """`product(x1, x2)`, with the leading axes of `x1` folded into one when `x2` is a
    matrix: the kernel's gradient is then one product of two matrices. Contracted over
    several axes instead (`(batch, tokens, k)` inputs), XLA:CPU computes it through
    transposed copies of the output gradient."""
    if len(x2.shape) == 2 and len(x1.shape) > 2:
        rows = product(ops.reshape(x1, (-1, x1.shape[-1])), x2)
        # The batch as -1: exporters tracing a symbolic batch (jax2onnx) cannot
        # map it onto the axes of `rows`.
        leading = tuple(x1.shape[1:-1])
        leading = (-1, *leading) if None not in leading else ops.shape(x1)[:-1]
        return ops.reshape(rows, (*leading, rows.shape[-1]))
    return product(x1, x2)


def _is_16bit(x):
    return keras.backend.standardize_dtype(x.dtype) in ("bfloat16", "float16")


def matmul_float32(x1, x2, transpose_x2=False):
    """`x1 @ x2` (or `x1 @ swapaxes(x2, -1, -2)`) accumulated in float32 and returned in float32.

    Float32 operands give `keras.ops.matmul`. Operands in bfloat16 or float16 (one dtype
    for both) are multiplied by XLA's 16-bit kernels where it has a float32 result for
    them (JAX; TensorFlow inside `jit_compile`), and as float32 copies elsewhere: the
    same numbers, since products of 16-bit floats are exact in float32. The gradients
    are computed the same way, each asked for in a form that XLA:CPU runs on its
    bfloat16 kernels.

    Args:
        x1: `(..., m, k)` tensor; a rank above that of `x2`, with `x2` of rank 2,
            multiplies every `(m, k)` matrix of `x1` by `x2` (a Dense layer's product).
        x2: `(..., k, n)` tensor with the same leading dimensions as `x1`, or `(k, n)`;
            `(..., n, k)` or `(n, k)` if `transpose_x2`.
        transpose_x2: multiply by `x2` with its last two axes swapped (attention
            logits: queries times keys), without a transpose in between, which XLA:CPU
            would compute from float32 copies of the operands.

    Returns:
        The `(..., m, n)` float32 product.

    Example:

    >>> a = keras.ops.ones((2, 3, 4), dtype="bfloat16")
    >>> b = keras.ops.full((4, 5), 1000.0, dtype="bfloat16")
    >>> product = matmul_float32(a, b)
    >>> keras.backend.standardize_dtype(product.dtype), float(product[0, 0, 0])
    ('float32', 4000.0)
    >>> keys = keras.ops.full((2, 6, 4), 2.0, dtype="bfloat16")
    >>> tuple(matmul_float32(a, keys, transpose_x2=True).shape)
    (2, 3, 6)
    """
    if _is_16bit(x1) and _xla_float32_product_available():
        return _float32_product(x1, x2, transpose_x2)
    x1, x2 = ops.cast(x1, "float32"), ops.cast(x2, "float32")
    return ops.matmul(x1, ops.swapaxes(x2, -1, -2) if transpose_x2 else x2)


def matmul(x1, x2):
    """`keras.ops.matmul(x1, x2)`, with 16-bit operands on XLA's 16-bit kernels.

    The result is the operands' dtype, rounded once from a float32 accumulation, as
    `keras.ops.matmul` computes it on every backend; under XLA (JAX; TensorFlow inside
    `jit_compile`) it comes from the float32 product of `matmul_float32` rather than
    from float32 copies of the operands. Elsewhere it is `keras.ops.matmul` (PyTorch's
    and TensorFlow's own kernels already use the CPU's bfloat16 units), on JAX with the
    leading axes of `x1` folded into rows when `x2` is a matrix (`_over_rows`).

    Example:

    >>> a = keras.ops.ones((2, 3, 4), dtype="bfloat16")
    >>> b = keras.ops.ones((4, 5), dtype="bfloat16")
    >>> keras.backend.standardize_dtype(matmul(a, b).dtype)
    'bfloat16'
    """
    if _is_16bit(x1) and _xla_float32_product_available():
        return ops.cast(_float32_product(x1, x2), x1.dtype)
    if keras.backend.backend() == "jax":
        # Keras' TensorFlow matmul folds the rows too (a tensordot); JAX's does not.
        return _over_rows(ops.matmul, x1, x2)
    return ops.matmul(x1, x2)


def dense(inputs, kernel, bias=None):
    """`inputs @ kernel + bias`: `keras.layers.Dense`'s product, without its activation.

    The product is `matmul`'s. With 16-bit operands under XLA (JAX; TensorFlow inside
    `jit_compile`) the bias is added to the float32 product and the sum rounded once to
    the 16-bit dtype: one rounding where `keras.layers.Dense` rounds twice, and the
    bias gradient summed in float32 (summed in 16 bits, XLA:CPU rewrites it as a slow
    windowed reduction; README, Performance). On PyTorch, when the operands share a
    dtype, it is one `torch.nn.functional.linear` call (`addmm`), which adds the bias as
    it writes the product: in float32 the same numbers as the product followed by the
    addition, in 16 bits the sum rounded once; one kernel and one pass over the output
    fewer (on a GPU the separate additions take a large share of a bfloat16 ViT's
    kernel time: bench/gpu_profile.json). Elsewhere the product is followed by the
    addition, as `keras.layers.Dense` computes them.

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

        # Variables read as their values (cast to the compute dtype under a mixed
        # policy), so the dtypes checked are those multiplied.
        operands = [as_tensor(x) for x in (inputs, kernel, bias) if x is not None]
        if operands[0].is_floating_point() and all(x.dtype == operands[0].dtype for x in operands):
            # linear takes torch.nn.Linear's (n, k) weight: the kernel's transpose, a
            # view that addmm reads back as the (k, n) kernel.
            inputs, kernel, *rest = operands
            return torch.nn.functional.linear(inputs, kernel.T, *rest)
    if _is_16bit(inputs) and _xla_float32_product_available():
        x = _float32_product(inputs, kernel)
        x = x if bias is None else x + ops.cast(bias, "float32")
        return ops.cast(x, inputs.dtype)
    x = matmul(inputs, kernel)
    return x if bias is None else ops.add(x, bias)
