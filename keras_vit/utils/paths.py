"""Paths that are local files or URLs of TensorFlow's file systems (`gs://...`): local
ones through `os` and `open`, URLs through `tf.io.gfile`, so that reading local files
needs no TensorFlow."""

import os


def _gfile():
    import tensorflow as tf  # only URLs need it: local files read on any backend

    return tf.io.gfile


def is_url(path):
    """Whether `path` names a file system by its scheme (`gs://bucket/x`).

    Example:

    >>> is_url("gs://bucket/model.npz"), is_url("runs/b16")
    (True, False)
    """
    return "://" in path


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
