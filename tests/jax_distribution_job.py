"""Trains a tiny ViT on digits with JAX on 4 host devices: one device, DataParallel and
ModelParallel; prints a JSON line with the loss curves and the kernels' shardings.
`jax_distribution_job.py fsdp`: one device and FullyShardedDataParallel; the JSON line has
their loss curves, the largest weight difference and each variable's bytes per device."""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.training import jax_distribution  # noqa: E402

digits = load_digits()
images = (digits.images[:128, :, :, None] / 8.0 - 1.0).astype("float32")
labels = np.eye(10, dtype="float32")[digits.target[:128]]


def losses(distribution):
    keras.distribution.set_distribution(distribution)
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(
        image_size=8, patch_size=2, hidden_dim=16, num_layers=2, num_heads=2, mlp_dim=32,
        num_classes=10, channels=1,
    )
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                  keras.losses.CategoricalCrossentropy(from_logits=True))
    history = model.fit(images, labels, batch_size=32, epochs=2, shuffle=False, verbose=0)
    shardings = {
        v.path: {
            "spec": [list(a) if isinstance(a, tuple) else a for a in v.value.sharding.spec],
            "mesh": dict(v.value.sharding.mesh.shape),
            "shard": list(v.value.addressable_shards[0].data.shape),
            "shape": list(v.shape),
        }
        for v in model.weights
    } if isinstance(distribution, keras.distribution.ModelParallel) else None
    return history.history["loss"], shardings


def fsdp():
    """One device against FSDP over 4, with Adam (whose slots are sharded too)."""
    runs = []
    for distribution in (None, jax_distribution.FullyShardedDataParallel()):
        keras.distribution.set_distribution(distribution)
        keras.utils.set_random_seed(0)
        model = keras_vit.ViT(
            image_size=8, patch_size=2, hidden_dim=16, num_layers=2, num_heads=2, mlp_dim=32,
            num_classes=10, channels=1,
        )
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.CategoricalCrossentropy(from_logits=True))
        history = model.fit(images, labels, batch_size=32, epochs=2, shuffle=False, verbose=0)
        runs.append((history.history["loss"], model))
    (one, single), (sharded, model) = runs
    return {
        "one": one, "fsdp": sharded,
        "weights_max_difference": max(
            float(np.abs(a - b).max()) for a, b in zip(single.get_weights(), model.get_weights())
        ),
        "bytes": {
            v.path: {"shape": list(v.shape), "full": v.value.nbytes,
                     "device": [s.data.nbytes for s in v.value.addressable_shards]}
            for v in model.weights + model.optimizer.variables
        },
    }


if sys.argv[1:] == ["fsdp"]:
    print(json.dumps(fsdp()))
else:
    one, _ = losses(None)
    data, _ = losses(keras.distribution.DataParallel())
    model, shardings = losses(jax_distribution.model_parallel(2))
    print(json.dumps({"one": one, "data": data, "model": model, "shardings": shardings}))
