"""Reads whole Keras models from disk: `.keras` files and sharded `.orbax` checkpoints.

A sharded checkpoint is the folder `keras_vit.utils.sharded_state.save_model` writes
(a run's `checkpoints/epoch_NNNN.orbax`, where the weights are split over devices).
Local files read on any backend; URLs (`gs://`, ...) through `tf.io.gfile`.
"""

import io
import os
import zipfile

import keras
import numpy as np

from keras_vit.utils import paths
from keras_vit.utils.errors import DamagedModel

# The two kinds of whole model: one host's `.keras` file, or a sharded folder.
SHARDED = ".orbax"
SUFFIXES = (".keras", SHARDED)




def read_keras(path):
    """`keras.saving.load_model(path, compile=False)`, with a truncated or corrupt file
    reported as such (Keras says "File not found" for any file that is not a zip, and
    passes on zipfile's own error for a member whose bytes changed on disk), and so a
    model whose weights hold NaN or infinite values (`DamagedModel`). A sharded
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
    keras_vit.utils.errors.DamagedModel: ...cut.keras is not a complete .keras file (14 bytes, truncated or corrupt)...
    """
    if path.endswith(SHARDED):
        from keras_vit.utils import sharded_state  # imports JAX: an optional extra

        return _checked(sharded_state.load_model(path), path)
    size = _incomplete_size(path)
    if size is not None:
        raise DamagedModel(
            f"{path} is not a complete .keras file ({size} bytes, truncated or corrupt); "
            "use another checkpoint of the run, or save the model again."
        )
    try:
        model = keras.saving.load_model(path, compile=False)
    except zipfile.BadZipFile as err:  # e.g. a member fails its CRC check: bytes changed on disk
        raise DamagedModel(
            f"{path} is corrupt ({err}: the file was damaged after it was saved); use "
            "another checkpoint of the run, or save the model again."
        ) from None
    return _checked(model, path)


def _checked(model, path):
    """`model`, read from `path`, unless its weights hold NaN or infinite values."""
    # Integer variables (a dropout's seed state) are not weights.
    weights = {v.path: keras.ops.convert_to_numpy(v.value) for v in model.weights
               if keras.backend.is_float_dtype(v.dtype)}
    _, not_finite = weight_problems(weights, path)
    if not_finite:
        raise DamagedModel(
            f"{not_finite}: a diverged run saves such weights; use an earlier checkpoint of "
            "the run."
        )
    return model


def weight_problems(arrays, source):
    """What keeps the arrays of `arrays` (name -> array or None), read from checkpoint
    `source`, from being weights: `(not_float, not_finite)`, a line naming those that are
    not floating point (an integer tensor loads as whole numbers, and the model answers
    nonsense) and one naming those that hold NaN or infinite values (a diverged run
    saves such weights), each None when there are none. Every reader of weights checks
    them here (`read_keras`, `keras_vit.load_pretrained`).

    Example:

    >>> weight_problems({"head/bias": np.array([0.0, np.inf]), "cls": None}, "x.npz")
    (None, 'Checkpoint x.npz holds NaN or infinite values in head/bias')
    >>> weight_problems({"cls": np.zeros(3, "int32")}, "x.npz")[0]
    'Checkpoint x.npz holds tensors that are not floating point, as weights are: cls (int32)'
    """
    arrays = {name: np.asarray(value) for name, value in arrays.items() if value is not None}
    not_float = sorted(
        name for name, value in arrays.items() if not keras.backend.is_float_dtype(value.dtype)
    )
    not_finite = sorted(
        name for name, value in arrays.items()
        if name not in not_float and not np.isfinite(value.astype("float32", copy=False)).all()
    )

    def line(names, what):
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        return f"Checkpoint {source} holds {what}{', '.join(names[:5])}{more}" if names else None

    typed = [f"{name} ({arrays[name].dtype})" for name in not_float]
    return (line(typed, "tensors that are not floating point, as weights are: "),
            line(not_finite, "NaN or infinite values in "))


def _incomplete_size(path):
    """The size in bytes of the file `path` when it is not a whole zip archive (a
    truncated or corrupt `.keras` file), else None (a whole one, a folder, or nothing)."""
    if "://" not in path:
        if os.path.isfile(path) and not zipfile.is_zipfile(path):
            return os.path.getsize(path)
        return None
    if not paths.exists(path) or paths.isdir(path):
        return None
    data = paths.read_bytes(path)  # GFile cannot seek from the end, as zipfile does
    return None if zipfile.is_zipfile(io.BytesIO(data)) else len(data)
