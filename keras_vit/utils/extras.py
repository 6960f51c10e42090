"""Optional dependencies: imported where they are used, and named by the extra that installs them.

The core install (`pip install keras3-vit`) runs on TensorFlow; the rest comes with extras
(pyproject.toml): `[jax]`, `[torch]`, `[export]`, `[hf]` and `[keras-cv]`. `EXTRAS` maps
each optional module to its extra, so a missing one is reported in one line with the
command that installs it.
"""

import importlib
import importlib.util

DISTRIBUTION = "keras3-vit"

# Optional module -> the extra of DISTRIBUTION that installs it (tests/test_packaging.py
# checks each against pyproject.toml).
EXTRAS = {
    "jax": "jax",
    "torch": "torch",
    "onnx": "export",
    "onnxruntime": "export",
    "onnxscript": "export",
    "tf2onnx": "export",
    "jax2onnx": "export",
    "ai_edge_litert": "export",
    "huggingface_hub": "hf",
    "keras_cv": "keras-cv",
}
# Keras backend -> the package Keras' `model.export(format="onnx")` exports with.
ONNX_EXPORTERS = {"tensorflow": "tf2onnx", "jax": "jax2onnx", "torch": "onnxscript"}


class MissingExtra(ImportError):
    """An optional package is not installed; the message names the extra that installs it."""


def install_hint(module):
    """The command that installs the optional `module` (a key of `EXTRAS`).

    Example:

    >>> install_hint("onnx")
    'pip install "keras3-vit[export]"'
    """
    return f'pip install "{DISTRIBUTION}[{EXTRAS[module]}]"'


def optional_import(module, purpose):
    """Imports the optional `module`, or raises `MissingExtra` naming the extra to install.

    Args:
        module: a key of `EXTRAS` (e.g. "onnx"), or a sub-module of one ("jax.numpy").
        purpose: what needs it, for the message (e.g. "ONNX export").

    Returns:
        The module.

    Example:

    >>> optional_import("onnx", "ONNX export").__name__
    'onnx'
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        top = module.partition(".")[0]
        # A package that is installed but fails to import for another reason (a broken
        # dependency of its own) is not fixed by installing the extra: let that through.
        if error.name is not None and error.name.partition(".")[0] != top:
            raise
        raise _missing(top, purpose) from None


def check_installed(module, purpose):
    """Raises `MissingExtra` as `optional_import` does when the optional `module` is not
    installed, without importing it (the command line checks before Keras starts).

    Example:

    >>> check_installed("onnx", "ONNX export")
    """
    top = module.partition(".")[0]
    if importlib.util.find_spec(top) is None:
        raise _missing(top, purpose)


def _missing(top, purpose):
    return MissingExtra(f"{purpose} needs {top}, which is not installed: {install_hint(top)}.")
