"""Softmax attention where each backend has its fastest form, and which form is faster.

`qkv_attention` hands PyTorch's fused attention the strided query, key and value of a
fused q|k|v projection, which it reads in place, where `keras.ops.dot_product_attention`
copies them to contiguous tensors first (and its output back); elsewhere it is the
keras.ops form. `fused_attention_is_faster` says whether that fused form beats the
explicit products of `keras_vit.layers.attention` on this backend and device.
"""

import functools

import keras
from keras import ops

from keras_vit.backend.eager import as_tensor


def fused_attention_is_faster():
    """Whether `qkv_attention` beats explicit products on this machine.

    `qkv_attention` runs fused kernels on PyTorch (CPU and GPU) and, on JAX, on GPUs and TPUs
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


def qkv_attention(qkv, mask=None):
    """Softmax attention scaled by `1 / sqrt(head_dim)` of the queries, keys and values
    stacked in `qkv`, the heads' outputs side by side: `keras.ops.dot_product_attention`
    of its three parts, reshaped to `(batch, tokens, heads * head_dim)`.

    On PyTorch it calls `torch.nn.functional.scaled_dot_product_attention` on the
    `(batch, heads, tokens, head_dim)` views of the three parts, as keras.ops does, but
    without making them contiguous first: the same kernel on the same numbers, reading
    the slices of a fused q|k|v projection in place, and without the Python of the
    keras.ops calls that slice and reshape them. Its output comes back in the layout of
    the query, so merging its heads is a view when the query's tokens are outside its
    heads. Where gradients will be taken of 16-bit inputs on a CPU, it computes in
    float32 and rounds the output to the inputs' dtype.

    Args:
        qkv: `(batch, tokens, 3, heads, head_dim)`: the queries, keys and values.
        mask: None, or a boolean tensor that broadcasts to `(batch, heads, queries,
            keys)`, True where a query attends to a key (every query must attend to one).

    Returns:
        The `(batch, tokens, heads * head_dim)` attention output, in `qkv`'s dtype.

    Example:

    >>> qkv = keras.random.normal((2, 5, 3, 4, 8), seed=0)
    >>> tuple(qkv_attention(qkv).shape)
    (2, 5, 32)
    """
    # Split (unbound on PyTorch), not indexed: the gradient of three indexed slices is
    # three zero tensors of q|k|v's size, each written into and summed (PyTorch; JAX pads
    # and adds); a split's is one concatenation.
    if keras.backend.backend() != "torch":
        q, k, v = (ops.squeeze(part, 2) for part in ops.split(qkv, 3, axis=2))
        out = ops.dot_product_attention(q, k, v, mask=mask)
        return ops.reshape(out, (-1, ops.shape(qkv)[1], qkv.shape[-2] * qkv.shape[-1]))
    import torch

    query, key, value = (x.transpose(1, 2) for x in as_tensor(qkv).unbind(2))
    dtype = query.dtype
    if dtype in (torch.bfloat16, torch.float16) and query.device.type == "cpu" and (
        torch.is_grad_enabled() and query.requires_grad
    ):
        # On a CPU, PyTorch's 16-bit fused attention computes its gradients slower than
        # its float32 one (docs/performance.md), so training takes the float32 kernel
        # and rounds its output once; inference keeps the faster 16-bit forward.
        query, key, value = (x.float() for x in (query, key, value))
    mask = None if mask is None else as_tensor(mask)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return out.to(dtype).transpose(1, 2).flatten(2)
