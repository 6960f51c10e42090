"""Trains a small ViT on the built-in digits through Keras' `fit` on NumPy arrays.

    KERAS_BACKEND=jax python bench/digits_fit.py [--epochs 8] [--dtype-policy mixed_bfloat16]

The check of a training run that needs no TensorFlow (no tf.data, no tf.distribute): it
runs on whichever device the backend finds, a GPU included (bench/gpu_checks.sh runs it
there on JAX and PyTorch), and fails (exit 1) unless the training loss fell from the
first epoch to the last and the held-out accuracy beat chance. Digits are 8x8 and upsampled
to 32x32 by repetition; the split is the `digits` source's (`keras_vit.digits`).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ARCH = dict(
    patch_size=8, hidden_dim=64, num_layers=4, num_heads=4, mlp_dim=128,
    image_size=32, channels=1, num_classes=10,
)


def train(epochs=8, batch_size=32, dtype_policy=None, seed=0):
    """Fits the small ViT (`ARCH`) on the digits' train split.

    Args:
        epochs, batch_size: of `model.fit`.
        dtype_policy: a Keras dtype policy name such as "mixed_bfloat16", or None.
        seed: Keras' random seed (initial weights, shuffling).

    Returns:
        A dict: the backend, its device, the policy, each epoch's loss and the test
        split's accuracy.

    Example:

    >>> result = train(epochs=2)
    >>> len(result["losses"]), result["losses"][-1] < result["losses"][0]
    (2, True)
    """
    import keras

    from bench.contenders import device_name
    from keras_vit import ViT, configure_for_backend, preprocess
    from keras_vit.digits import SPLITS

    configure_for_backend()

    keras.utils.set_random_seed(seed)
    if dtype_policy:
        keras.mixed_precision.set_dtype_policy(dtype_policy)
    try:
        (x_train, y_train), (x_test, y_test) = (upsampled(s) for s in SPLITS)
        model = ViT(**ARCH)
        model.compile(
            optimizer=keras.optimizers.AdamW(3e-3, weight_decay=1e-4),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        to_input = lambda x: keras.ops.convert_to_numpy(preprocess(x))
        history = model.fit(
            to_input(x_train), y_train, batch_size=batch_size, epochs=epochs, verbose=0
        )
        _, accuracy = model.evaluate(to_input(x_test), y_test, verbose=0)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    return {
        "backend": keras.backend.backend(),
        "device": device_name(keras.backend.backend()),
        "dtype_policy": dtype_policy or "float32",
        "losses": [round(float(v), 4) for v in history.history["loss"]],
        "test_accuracy": round(float(accuracy), 4),
    }


def upsampled(split):
    """One split of the digits at 32x32 (each pixel repeated 4x4), with its labels."""
    from keras_vit.digits import digits_arrays

    images, labels = digits_arrays(split)
    return images.repeat(4, axis=1).repeat(4, axis=2), labels


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dtype-policy", default=None, help="e.g. mixed_bfloat16")
    args = parser.parse_args(argv)
    result = train(args.epochs, args.batch_size, args.dtype_policy)
    print(json.dumps(result))
    losses = result["losses"]
    if not (losses[-1] < losses[0] and result["test_accuracy"] > 0.2):
        print("digits_fit: the loss did not fall or the accuracy is at chance", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
