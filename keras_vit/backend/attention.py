"""Softmax attention where each backend has its fastest form, and which form is faster.

`dot_product_attention` hands PyTorch's fused attention the strided query, key and value
that it reads in place, where `keras.ops.dot_product_attention` copies them to
contiguous tensors first (and its output back); elsewhere it is the keras.ops form.
`fused_attention_is_faster` says whether that fused form beats the explicit products of
`keras_vit.layers.attention` on this backend and device.
"""

import functools

import keras
from keras import ops


def fused_attention_is_faster():
    """Whether `dot_product_attention` beats explicit products on this machine.

    It runs fused kernels on PyTorch (CPU and GPU) and, on JAX, on GPUs and TPUs
    (cuDNN or Pallas flash attention); on TensorFlow and on a JAX CPU it is two
    einsums, slower than the batched matmuls of `keras_vit.layers.attention`
    (bench/models.py).

    Example:

    >>> isinstance(fused_attention_is_faster(), bool)
    True
    """
    backend = keras.backend.backend()
    if backend == "torch":
        # Answered before any cache: `torch.compile` traces through a cached function's
        # wrapper with a warning that it might be stale.
        return True
    if backend == "jax":
        return _jax_computes_off_cpu()
    return False


@functools.cache
def _jax_computes_off_cpu():
    return not keras.distribution.list_devices()[0].startswith("cpu")


def dot_product_attention(query, key, value, mask=None):
    """`keras.ops.dot_product_attention(query, key, value, mask=mask)`: softmax
    attention scaled by `1 / sqrt(head_dim)`, in the `(batch, tokens, heads, head_dim)`
    layout.

    On PyTorch it calls `torch.nn.functional.scaled_dot_product_attention` on the
    `(batch, heads, tokens, head_dim)` views of its arguments, as keras.ops does, but
    without making them contiguous first: the same kernel on the same numbers, reading
    slices of a fused q|k|v projection in place. Its output comes back in the layout
    of the query, so the returned `(batch, tokens, heads, head_dim)` view of it is
    contiguous when the query's tokens are outside its heads. Where gradients will be
    taken of 16-bit inputs on a CPU, it computes in float32 and rounds the output to
    the inputs' dtype.

    Args:
        query, key, value: `(batch, tokens, heads, head_dim)` tensors of one dtype
            (key and value may have another number of tokens).
        mask: None, or a boolean tensor that broadcasts to `(batch, heads, queries,
            keys)`, True where a query attends to a key (every query must attend to one).

    Returns:
        The `(batch, tokens, heads, head_dim)` attention output.

    Example:

    >>> q = keras.random.normal((2, 5, 3, 8), seed=0)
    >>> out = dot_product_attention(q, q, q)
    >>> tuple(out.shape)
    (2, 5, 3, 8)
    """
    if keras.backend.backend() != "torch":
        return ops.dot_product_attention(query, key, value, mask=mask)
    import torch

    query, key, value = (ops.convert_to_tensor(x).transpose(1, 2) for x in (query, key, value))
    dtype = query.dtype
    if dtype in (torch.bfloat16, torch.float16) and query.device.type == "cpu" and (
        torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value))
    ):
        # On a CPU, PyTorch's 16-bit fused attention computes its gradients slower than
        # its float32 one (docs/performance.md), so training takes the float32 kernel
        # and rounds its output once; inference keeps the faster 16-bit forward.
        query, key, value = (x.float() for x in (query, key, value))
    mask = None if mask is None else ops.convert_to_tensor(mask)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return out.to(dtype).transpose(1, 2)
