"""Calling a built sublayer from its parent's `call` without `Layer.__call__` on PyTorch."""

import keras


def call_sublayer(parent, layer, *args, **kwargs):
    """`layer(*args, **kwargs)` from within `parent.call` (or as a node of a functional
    `parent`'s graph), through `layer.call` where that computes the same numbers.

    On PyTorch each Keras layer call costs Python time (`Layer.__call__`: input
    conversion, autocast and name scopes, the call context) that an eager step spends
    every time, and that a GPU waits on (bench/gpu_profile.json). Under the parent's
    call its autocast scope is open, so a built sublayer of the same dtype policy
    computes the same numbers through `call` when `Layer.__call__` would change nothing
    else: its floating-point tensor arguments already in its compute dtype (`__call__`
    would cast them) and no PyTorch hook on it (`__call__` runs them). A quantized
    sublayer has another policy and runs Keras' `quantized_call`; other backends trace
    or compile the step, where the overhead is paid once.

    Example:

    >>> parent, dense = keras.layers.Dense(2), keras.layers.Dense(3)
    >>> tuple(call_sublayer(parent, dense, keras.ops.ones((1, 4))).shape)
    (1, 3)
    """
    if (
        keras.backend.backend() == "torch"
        and layer.built
        and layer.dtype_policy.name == parent.dtype_policy.name
        and _in_dtype(layer.compute_dtype, args, kwargs.values())
        and not _torch_hooks(layer)
    ):
        return layer.call(*args, **kwargs)
    return layer(*args, **kwargs)


def _in_dtype(dtype, *arguments):
    """Whether `Layer.__call__` would leave every argument as it is: a tensor (of
    `dtype` already, if of floating point) or a plain Python value."""
    import torch

    for values in arguments:
        for x in values:
            if isinstance(x, torch.Tensor):
                if x.is_floating_point() and str(x.dtype) != f"torch.{dtype}":
                    return False
            elif not (x is None or isinstance(x, (bool, int, float, str))):
                return False
    return True


def _torch_hooks(layer):
    """Whether a PyTorch hook would run when `layer` is called (`torch.nn.Module.__call__`
    checks the same: on the module, or registered for every module)."""
    from torch.nn.modules import module

    return bool(
        layer._forward_hooks or layer._forward_pre_hooks or layer._backward_hooks
        or layer._backward_pre_hooks or module._global_forward_hooks
        or module._global_forward_pre_hooks or module._global_backward_hooks
        or module._global_backward_pre_hooks
    )


def regularise(y, training, *layers):
    """`y` through the regularising `layers` (Dropout, DropPath) that change it.

    At inference, or at rate 0, such a layer returns `y` unchanged, and each Keras
    layer call costs Python time that eager backends (PyTorch) spend on every step.

    Example:

    >>> dropout = keras.layers.Dropout(0.5)
    >>> y = keras.ops.ones((2, 3))
    >>> regularise(y, False, dropout) is y
    True
    """
    for layer in layers:
        if training and layer.rate > 0:
            y = layer(y, training=training)
    return y
