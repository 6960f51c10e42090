"""Reads whole Keras models from disk: `.keras` files and sharded `.orbax` checkpoints.

A sharded checkpoint is the folder `keras_vit.utils.sharded_state.save_model` writes
(a run's `checkpoints/epoch_NNNN.orbax`, where the weights are split over devices).
Local files read on any backend; URLs (`gs://`, ...) through `tf.io.gfile`.
"""

import io
import os
import zipfile

import keras

# The two kinds of whole model: one host's `.keras` file, or a sharded folder.
SHARDED = ".orbax"
SUFFIXES = (".keras", SHARDED)


def is_model(path):
    """Whether the file or folder `path` holds a whole Keras model that `read_keras`
    reads: a `.keras` file or a sharded checkpoint (`epoch_NNNN.orbax`).

    Example:

    >>> is_model("runs/b16/checkpoints/epoch_0003.orbax"), is_model("ViT-B_16.npz")
    (True, False)
    """
    return path.endswith(SUFFIXES)


def read_keras(path):
    """`keras.saving.load_model(path, compile=False)`, with a truncated or corrupt file
    reported as such (Keras says "File not found" for any file that is not a zip, and
    passes on zipfile's own error for a member whose bytes changed on disk). A sharded
    checkpoint folder (`epoch_NNNN.orbax`) is read into this host, whole
    (`keras_vit.utils.sharded_state.load_model`; Orbax must be installed).

    Example:

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "cut.keras")
    >>> with open(path, "wb") as f:
    ...     _ = f.write(b"PK\\x03\\x04 cut short")
    >>> read_keras(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: ...cut.keras is not a complete .keras file (14 bytes, truncated or corrupt)...
    """
    if path.endswith(SHARDED):
        from keras_vit.utils import sharded_state  # imports JAX: an optional extra

        return sharded_state.load_model(path)
    size = _incomplete_size(path)
    if size is not None:
        raise ValueError(
            f"{path} is not a complete .keras file ({size} bytes, truncated or corrupt); "
            "use another checkpoint of the run, or save the model again."
        )
    try:
        return keras.saving.load_model(path, compile=False)
    except zipfile.BadZipFile as err:  # e.g. a member fails its CRC check: bytes changed on disk
        raise ValueError(
            f"{path} is corrupt ({err}: the file was damaged after it was saved); use "
            "another checkpoint of the run, or save the model again."
        ) from None


def _incomplete_size(path):
    """The size in bytes of the file `path` when it is not a whole zip archive (a
    truncated or corrupt `.keras` file), else None (a whole one, a folder, or nothing)."""
    if "://" not in path:
        if os.path.isfile(path) and not zipfile.is_zipfile(path):
            return os.path.getsize(path)
        return None
    import tensorflow as tf  # only URLs need it: a local file reads on any backend

    if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
        return None
    with tf.io.gfile.GFile(path, "rb") as f:  # GFile cannot seek from the end, as zipfile does
        data = f.read()
    return None if zipfile.is_zipfile(io.BytesIO(data)) else len(data)
