"""Sharded arrays on disk through Orbax (JAX): each process writes and reads only its
own shards, as Keras' `OrbaxCheckpoint` and big_vision do, never gathering a weight onto
one host. Orbax writes a checkpoint into a temporary folder and renames it once every
process has written its part, so a folder that exists is complete.

Imported only on the JAX backend (`pip install "keras3-vit[jax]"` brings Orbax).
"""

import jax


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
    """Writes the pytree of arrays `tree` to the folder `path` (absolute or `gs://`),
    replacing any folder there; every process must call it. Returns once written."""
    checkpointer = _checkpointer()
    checkpointer.save(path, tree, force=True)
    checkpointer.wait_until_finished()
    checkpointer.close()


def metadata(path):
    """The tree of the arrays saved in the folder `path`, each as a
    `jax.ShapeDtypeStruct` (shape and dtype)."""
    tree = _checkpointer().metadata(path).item_metadata.tree
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), tree)


def restore(path, like):
    """The arrays saved in `path`, each placed as the JAX array (or `jax.ShapeDtypeStruct`)
    at the same place of the tree `like` is (its shape, dtype and sharding); every
    process must call it."""
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
    import keras
    import numpy as np

    if all(getattr(v.value, "is_fully_addressable", True) for v in model.variables):
        return model
    from jax.experimental import multihost_utils

    values = [np.asarray(multihost_utils.process_allgather(v.value, tiled=True)) for v in model.variables]
    distribution = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        copy = type(model).from_config(model.get_config())
    finally:
        keras.distribution.set_distribution(distribution)
    if [tuple(v.shape) for v in copy.variables] != [a.shape for a in values]:
        raise ValueError(
            f"{model.name} rebuilt from its config has other variables than the model: "
            "it cannot be gathered into a .keras file."
        )
    for variable, value in zip(copy.variables, values):
        variable.assign(value)
    return copy
