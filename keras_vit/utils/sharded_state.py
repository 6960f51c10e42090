"""Sharded arrays on disk through Orbax (JAX): each process writes and reads only its
own shards, as Keras' `OrbaxCheckpoint` and big_vision do, never gathering a weight onto
one host. Orbax writes a checkpoint into a temporary folder and renames it once every
process has written its part, so a folder that exists is complete.

Written on the JAX backend (`pip install "keras3-vit[jax]"` brings Orbax); a model saved
by `save_model` reads back into one host (`load_model`) on any backend where Orbax is
installed.
"""

import contextlib
import logging
import os

import jax
import keras
import numpy as np

from keras_vit.utils import paths
from keras_vit.utils.errors import DamagedModel


def _orbax_path(path):
    """`path` as Orbax takes it (every function here takes any other): absolute, or a
    URL (`gs://`) as it is."""
    return path if paths.is_url(path) else os.path.abspath(path)


def is_sharded(variables):
    """Whether any of the Keras `variables` is split over devices (FSDP, model-parallel
    layouts) rather than whole on each."""
    return any(
        not getattr(getattr(v.value, "sharding", None), "is_fully_replicated", True)
        for v in variables
    )


def _checkpointer():
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()


def save(path, tree):
    """Writes the pytree of arrays `tree` to the folder `path` (a local folder or `gs://`),
    replacing any folder there; every process must call it. Returns once written."""
    path = _orbax_path(path)
    checkpointer = _checkpointer()
    checkpointer.save(path, tree, force=True)
    checkpointer.wait_until_finished()
    checkpointer.close()


def save_model(path, model):
    """Writes `model` to the folder `path` (a local folder or `gs://`), replacing any folder
    there: its architecture (`keras.saving.serialize_keras_object`, as a `.keras` file
    holds it) and its variables, each process its own shards; every process must call it.
    The folder appears whole once every process has written (Orbax), never part-way."""
    path = _orbax_path(path)
    import orbax.checkpoint as ocp

    checkpointer = _model_checkpointer()
    checkpointer.save(
        path,
        ocp.args.Composite(
            architecture=ocp.args.JsonSave(keras.saving.serialize_keras_object(model)),
            variables=ocp.args.StandardSave([v.value for v in model.variables]),
        ),
        force=True,
    )
    checkpointer.close()


def load_model(path):
    """The model `save_model` wrote to the folder `path`, rebuilt from its architecture
    outside any distribution, each variable whole on this process's first device (the
    folder may hold the shards of any number of devices and processes).

    Example:

    >>> import os, tempfile, keras_vit
    >>> path = os.path.join(tempfile.mkdtemp(), "epoch_0001.orbax")
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=10)
    >>> save_model(path, model)
    >>> load_model(path).output_shape
    (None, 10)
    """
    path = _orbax_path(path)
    import orbax.checkpoint as ocp

    checkpointer = _model_checkpointer()
    with _reading(path):
        saved = checkpointer.metadata(path).item_metadata["variables"].tree
    config = dict(architecture(path), compile_config=None)  # as load_model(compile=False)
    model = _outside_distribution(lambda: keras.saving.deserialize_keras_object(config))
    _check_variables(model, [tuple(m.shape) for m in saved], path)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    like = [jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=device) for m in saved]
    with _reading(path):
        values = checkpointer.restore(
            path, ocp.args.Composite(variables=ocp.args.StandardRestore(like))
        ).variables
    for variable, value in zip(model.variables, values):
        variable.assign(np.asarray(value))
    return model


def architecture(path):
    """The architecture of the model `save_model` wrote to the folder `path`: the
    `keras.saving.serialize_keras_object` dict (a `.keras` file's `config.json`)."""
    path = _orbax_path(path)
    import orbax.checkpoint as ocp

    with _reading(path):
        return _model_checkpointer().restore(
            path, ocp.args.Composite(architecture=ocp.args.JsonRestore())
        ).architecture


@contextlib.contextmanager
def _reading(path):
    """Reports a checkpoint folder Orbax cannot read (a file of it truncated or corrupt)
    as a `DamagedModel` naming it, in one line: Orbax's reading tasks, cancelled when
    one fails, otherwise log a traceback each (asyncio's logger), thousands of lines."""
    tasks = logging.getLogger("asyncio")
    disabled, tasks.disabled = tasks.disabled, True
    try:
        yield
    except Exception as err:
        # tensorstore appends its whole spec (kilobytes of JSON) to its messages.
        reason = " ".join(str(err).split(" [tensorstore_spec=")[0].split())
        reason = reason if len(reason) <= 300 else reason[:300] + "..."
        raise DamagedModel(
            f"{path} is damaged: a file in it is truncated or corrupt ({type(err).__name__}: "
            f"{reason}); use another checkpoint of the run."
        ) from None
    finally:
        tasks.disabled = disabled


def _model_checkpointer():
    import orbax.checkpoint as ocp

    return ocp.Checkpointer(
        ocp.CompositeCheckpointHandler(
            architecture=ocp.JsonCheckpointHandler(), variables=ocp.StandardCheckpointHandler()
        )
    )


def _outside_distribution(build):
    """`build()` with no `keras.distribution` set: its variables whole on one device."""
    distribution = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        return build()
    finally:
        keras.distribution.set_distribution(distribution)


def _check_variables(model, shapes, source):
    if [tuple(v.shape) for v in model.variables] != list(shapes):
        raise ValueError(
            f"{model.name} rebuilt from its config has other variables than {source}: it "
            "cannot take its weights."
        )


def metadata(path):
    """The tree of the arrays saved in the folder `path`, each as a
    `jax.ShapeDtypeStruct` (shape and dtype)."""
    path = _orbax_path(path)
    tree = _checkpointer().metadata(path).item_metadata.tree
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), tree)


def restore(path, like):
    """The arrays saved in `path`, each placed as the JAX array (or `jax.ShapeDtypeStruct`)
    at the same place of the tree `like` is (its shape, dtype and sharding); every
    process must call it."""
    path = _orbax_path(path)
    target = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), like
    )
    return _checkpointer().restore(path, target)


def one_host_copy(model):
    """`model` with each weight whole in this process, to save as a `.keras` file (one
    host's copy of the model): `model` itself when it holds them already (one process),
    else a copy built from its config outside the distribution whose weights are gathered
    from every process. Every process must call it.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=10)
    >>> one_host_copy(model) is model
    True
    """
    if all(getattr(v.value, "is_fully_addressable", True) for v in model.variables):
        return model
    from jax.experimental import multihost_utils

    values = [np.asarray(multihost_utils.process_allgather(v.value, tiled=True)) for v in model.variables]
    copy = _outside_distribution(lambda: type(model).from_config(model.get_config()))
    _check_variables(copy, [a.shape for a in values], f"the model {model.name}")
    for variable, value in zip(copy.variables, values):
        variable.assign(value)
    return copy
