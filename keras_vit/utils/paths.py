"""File operations on paths that are local files or URLs of TensorFlow's file systems
(`gs://...`): local ones through `os`, `shutil` and `open`, URLs through `tf.io.gfile`,
imported only for them, so that reading and writing local files needs no TensorFlow
(`keras-vit predict --from RUN` on JAX or PyTorch imports none).

Each function behaves as its `tf.io.gfile` namesake does on a local path."""

import os
import shutil


def _gfile():
    import tensorflow as tf  # only URLs need it: local files read on any backend

    return tf.io.gfile


def is_url(path):
    """Whether `path` names a file system by its scheme (`gs://bucket/x`).

    Example:

    >>> is_url("gs://bucket/model.npz"), is_url("runs/b16")
    (True, False)
    """
    return "://" in str(path)


def exists(path):
    return _gfile().exists(path) if is_url(path) else os.path.exists(path)


def isdir(path):
    return _gfile().isdir(path) if is_url(path) else os.path.isdir(path)


def join(directory, name):
    """`name` inside `directory`, with `/` for a URL.

    Example:

    >>> join("gs://bucket/run/", "config.json")
    'gs://bucket/run/config.json'
    """
    if is_url(directory):
        return f"{directory.rstrip('/')}/{name}"
    return os.path.join(directory, name)


def open_binary(path):
    """`path` opened for reading bytes."""
    return _gfile().GFile(path, "rb") if is_url(path) else open(path, "rb")


def read_bytes(path):
    with open_binary(path) as f:
        return f.read()


def write_bytes(path, data):
    """Writes the bytes `data` to the file `path`, replacing it."""
    with (_gfile().GFile(path, "wb") if is_url(path) else open(path, "wb")) as f:
        f.write(data)


def read_text(path):
    """The UTF-8 text of `path`, its line ends as they are (as `tf.io.gfile.GFile`
    reads it, where `open` would translate them).

    Example:

    >>> import tempfile
    >>> path = join(tempfile.mkdtemp(), "notes.txt")
    >>> with open(path, "wb") as f:
    ...     _ = f.write("α\\r\\n".encode())
    >>> read_text(path)
    'α\\r\\n'
    """
    return read_bytes(path).decode("utf-8")


def listdir(path):
    """The names in the folder `path` (a URL's sub-folders may end with `/`)."""
    return _gfile().listdir(path) if is_url(path) else os.listdir(path)


def makedirs(path):
    """Creates the folder `path` and those above it, unless there (`""`, the current
    folder, is)."""
    if is_url(path):
        _gfile().makedirs(path)
    elif path:
        os.makedirs(path, exist_ok=True)


def remove(path):
    """Deletes the file `path`."""
    if is_url(path):
        _gfile().remove(path)
    else:
        os.remove(path)


def rmtree(path):
    """Deletes the folder `path` with all it holds."""
    if is_url(path):
        _gfile().rmtree(path)
    else:
        shutil.rmtree(path)


def rename(source, target):
    """Renames `source` to `target`, replacing it (a file, or an empty folder)."""
    if is_url(source) or is_url(target):
        _gfile().rename(source, target, overwrite=True)
    else:
        os.replace(source, target)
