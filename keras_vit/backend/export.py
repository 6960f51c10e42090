"""The export-tracing flag: inside `tracing_for_export()` layers trace the forms that
every exporter follows instead of their fastest ones."""

import contextlib

import keras

_EXPORT_TRACING = []


@contextlib.contextmanager
def tracing_for_export():
    """Within it, layers trace the forms that every exporter follows.

    Exporters (jax2onnx, tf2onnx, torch.onnx, the LiteRT converter) each accept
    a subset of the backends' operations; a layer whose fastest form falls outside
    one of them traces an equal form built from basic operations instead, inside
    this context only, so training and inference keep their fast paths.

    Example:

    >>> with tracing_for_export():
    ...     is_tracing_for_export()
    True
    >>> is_tracing_for_export()
    False
    """
    _EXPORT_TRACING.append(True)
    try:
        yield
    finally:
        _EXPORT_TRACING.pop()


def is_tracing_for_export():
    """Whether the caller runs inside `tracing_for_export()` or a TorchScript trace.

    Keras' own ONNX export on PyTorch (`model.export(path, format="onnx")` with a
    variable batch size) traces the model with TorchScript, so a model exported that
    way outside the context takes the export forms too.
    """
    if _EXPORT_TRACING:
        return True
    if keras.backend.backend() != "torch":
        return False
    import torch

    return torch.jit.is_tracing()
