"""Sharded arrays on disk through Orbax (JAX): each process writes and reads only its
own shards, as Keras' `OrbaxCheckpoint` and big_vision do, never gathering a weight onto
one host. Orbax writes a checkpoint into a temporary folder and renames it once every
process has written its part, so a folder that exists is complete.

Imported only on the JAX backend (`pip install "keras-vit[jax]"` brings Orbax).
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
