"""The keras.ops a Transformer block calls on every step, without Keras' Python on PyTorch.

On PyTorch a model runs eagerly, one Python call per op, and each `keras.ops` call
adds its own Python (argument conversion, a walk over its arguments for symbolic
tensors, dtype lookups) to the torch function it ends in: at a small batch that is most
of a step (`bench/models.py --overhead`). Here each function calls the torch function
that keras.ops would, on the same arguments, so its numbers are keras.ops' to the bit
(tests/test_backend_ops.py); on the other backends it is the keras.ops call, traced
once into the compiled step.
"""

import keras
from keras import ops

from keras_vit.backend.export import is_tracing_for_export


def _on_torch(*tensors):
    """Whether the PyTorch forms apply: the torch backend, not tracing for an exporter
    (which follows the keras.ops forms: `keras_vit.backend.export`), and `tensors` torch
    tensors (not the numpy arrays or symbolic values a user may pass to a layer's `call`)."""
    if keras.backend.backend() != "torch" or is_tracing_for_export():
        return False
    import torch

    return all(isinstance(x, torch.Tensor) for x in tensors)


def as_tensor(x):
    """`keras.ops.convert_to_tensor(x)` on PyTorch: a tensor as it is, and a variable's
    `value` (cast to the compute dtype inside an autocast scope, read from a stateless
    scope inside one), without the conversion's Python.

    Example:

    >>> v = keras.Variable([1.0, 2.0])
    >>> keras.ops.convert_to_numpy(as_tensor(v)).tolist()
    [1.0, 2.0]
    """
    if isinstance(x, keras.Variable):
        return x.value
    if _on_torch(x):
        return x
    return ops.convert_to_tensor(x)


def layer_norm(x, gamma, beta, epsilon, dtype):
    """`keras.ops.layer_normalization` over the last axis of `x`, cast to `dtype`: what
    `keras.layers.LayerNormalization.call` computes with `axis=-1`.

    As keras.ops, it normalises in float32 whatever the dtype of `x` (Keras'
    `result_type(dtype, "float32")` is float32 for every dtype, float64 included), with
    `gamma` and `beta` in float32, then casts back to the dtype of `x` and on to `dtype`.

    Args:
        x: `(..., features)` tensor.
        gamma: `(features,)` scale (tensor or variable), or None.
        beta: `(features,)` offset (tensor or variable), or None.
        epsilon: added to the variance.
        dtype: the output's dtype (the layer's compute dtype).

    Returns:
        The normalised `x`, in `dtype`.

    Example:

    >>> x = keras.ops.convert_to_tensor([[1.0, 2.0, 3.0]])
    >>> y = layer_norm(x, None, None, 1e-6, "float32")
    >>> [round(v, 4) for v in keras.ops.convert_to_numpy(y)[0].tolist()]
    [-1.2247, 0.0, 1.2247]
    """
    if not _on_torch(x):
        return ops.cast(ops.layer_normalization(x, gamma, beta, axis=-1, epsilon=epsilon), dtype)
    import torch

    original = x.dtype
    x = x.to(torch.float32)
    weights = [None if w is None else as_tensor(w).to(torch.float32) for w in (gamma, beta)]
    y = torch.nn.functional.layer_norm(x, x.shape[-1:], *weights, epsilon)
    return y.to(original).to(getattr(torch, keras.backend.standardize_dtype(dtype)))


def gelu(x, approximate=False):
    """`keras.activations.gelu(x, approximate)`: the exact (erf) GELU, or its tanh form.

    Example:

    >>> y = gelu(keras.ops.convert_to_tensor([1.0]))
    >>> round(float(keras.ops.convert_to_numpy(y)[0]), 4)
    0.8413
    """
    if not _on_torch(x):
        return keras.activations.gelu(x, approximate=approximate)
    import torch

    return torch.nn.functional.gelu(x, approximate="tanh" if approximate else "none")


def split_last_axis(x, shape):
    """`x` of shape `(batch, tokens, features)` reshaped to `(batch, tokens, *shape)`,
    where `features` is the product of `shape`; the batch and token counts may be
    unknown until the call.

    Example:

    >>> tuple(split_last_axis(keras.ops.ones((2, 5, 12)), (3, 4)).shape)
    (2, 5, 3, 4)
    """
    if not _on_torch(x):
        return ops.reshape(x, (-1, ops.shape(x)[1], *shape))
    return x.unflatten(-1, tuple(shape))
