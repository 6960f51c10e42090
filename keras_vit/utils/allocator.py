"""Keeps the memory that XLA:CPU (JAX) and PyTorch free, for the next step to reuse.

Under JAX, XLA:CPU mallocs a step's temporary buffers on every call and frees them
at its end; PyTorch frees every tensor when its last reference goes. glibc hands blocks
that large straight back to the kernel, so the next step faults every page in again, at
a cost in system CPU time on every step (the README's Performance section gives the
figures, measured with `bench/contenders.py` and `bench/allocator.py`). TensorFlow's
allocator already keeps its memory.

`configure_for_backend()` (`keras_vit.configure_for_backend`) opts a process in: the
`keras-vit` command and the benchmarks call it before Keras starts; `import keras_vit`
does not, since the setting holds for every allocation of the process, the user's own
included. It keeps freed memory under JAX and PyTorch, unless the environment sets
`KERAS_VIT_MALLOC=system` (never; `keep`, the default, says so explicitly). It reads
the backend as Keras will (`keras_backend()`), without importing Keras.
"""

import ctypes
import json
import os
import platform
import sys

# '' off glibc (macOS, musl), whose allocators have no mallopt.
GLIBC = platform.libc_ver()[0] == "glibc"
ENV_VAR = "KERAS_VIT_MALLOC"
ENV_CHOICES = ("keep", "system")
# mallopt(3) parameters from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_NEVER = -1  # mallopt(3): a trim threshold of -1 disables trimming


def keep_freed_memory():
    """Sets glibc's malloc to keep freed memory for reuse; returns whether it could.

    One arena for all threads (the buffers that XLA's worker threads free are
    reused by the next step's), no `mmap` for large blocks (they would go back to
    the kernel on `free`) and no trimming of the heap.
    The process's resident memory then stays at its high-water mark, as under
    TensorFlow's allocator. Without glibc (macOS, musl) it does nothing.

    Example (in a fresh process: the setting holds for the rest of the process's life):

    >>> import subprocess, sys
    >>> code = "from keras_vit.utils.allocator import keep_freed_memory; print(keep_freed_memory())"
    >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    'True'
    """
    if not GLIBC:
        return False
    libc = ctypes.CDLL("libc.so.6")
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER))
    return all(libc.mallopt(param, value) == 1 for param, value in settings)


def keras_backend():
    """The Keras backend of this process, without importing Keras if it is not yet.

    `keras.backend.backend()` once Keras is imported; before that, what Keras will
    choose: `KERAS_BACKEND`, else the `backend` of `keras.json` in `KERAS_HOME` (default
    `~/.keras`, or `/tmp/.keras` when the home folder is read-only), else TensorFlow.

    Example:

    >>> import keras
    >>> keras_backend() == keras.backend.backend()
    True
    """
    if "keras" in sys.modules and hasattr(sys.modules["keras"], "backend"):
        return sys.modules["keras"].backend.backend()
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.path.expanduser("~")
    folder = os.environ.get("KERAS_HOME") or os.path.join(
        home if os.access(home, os.W_OK) else "/tmp", ".keras"
    )
    try:
        with open(os.path.join(folder, "keras.json")) as f:
            return json.load(f).get("backend", "tensorflow")
    except (OSError, ValueError):
        return "tensorflow"


def keeps_freed_memory(backend, choice):
    """Whether `configure_for_backend` keeps freed memory for Keras backend `backend`
    and the `KERAS_VIT_MALLOC` value `choice` (None when unset).

    Example:

    >>> keeps_freed_memory("torch", None), keeps_freed_memory("tensorflow", None)
    (True, False)
    >>> keeps_freed_memory("torch", "keep"), keeps_freed_memory("jax", "system")
    (True, False)
    """
    if choice is not None and choice not in ENV_CHOICES:
        raise ValueError(
            f"{ENV_VAR}={choice!r} is not a choice: expected one of "
            f"{', '.join(map(repr, ENV_CHOICES))}."
        )
    return backend in ("jax", "torch") and choice != "system"


def configure_for_backend(backend=None):
    """Keeps freed memory where `keeps_freed_memory` says so; see the module.

    `backend` defaults to `keras_backend()`; the choice is `KERAS_VIT_MALLOC`.
    """
    backend = backend or keras_backend()
    if keeps_freed_memory(backend, os.environ.get(ENV_VAR)):
        keep_freed_memory()
