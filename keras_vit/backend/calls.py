"""Calling a built sublayer from its parent's `call` without `Layer.__call__` on PyTorch."""

import keras


def call_sublayer(parent, layer, *args, **kwargs):
    """`layer(*args, **kwargs)` from within `parent.call`, through `layer.call` where
    that computes the same numbers.

    On PyTorch each Keras layer call costs Python time (`Layer.__call__`: input
    conversion, autocast and name scopes, the call context) that an eager step spends
    every time, and that a GPU waits on (bench/gpu_profile.json). Within the parent's
    call the inputs are in its compute dtype under its autocast scope, so a built
    sublayer of the same dtype policy computes the same numbers through `call`. A
    quantized sublayer has another policy and runs Keras' `quantized_call`; other
    backends trace or compile the step, where the overhead is paid once.

    Example:

    >>> parent, dense = keras.layers.Dense(2), keras.layers.Dense(3)
    >>> tuple(call_sublayer(parent, dense, keras.ops.ones((1, 4))).shape)
    (1, 3)
    """
    if (
        keras.backend.backend() == "torch"
        and layer.built
        and layer.dtype_policy.name == parent.dtype_policy.name
    ):
        return layer.call(*args, **kwargs)
    return layer(*args, **kwargs)


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
