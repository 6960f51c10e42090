"""Does the input pipeline keep up with training? Images/s of both, on this machine.

Measures, one after the other in the same process:
1. the training input pipeline at 224 px on a folder of JPEGs this script writes
   (decode + inception crop + flip + RandAugment(2, 15), batched, scaled), and
2. ViT-Ti/16 training steps at 224 px (Adam, softmax cross-entropy, XLA where the
   strategy allows it) on one batch held in memory,
and prints images/s of each and their ratio. The pipeline should deliver at least
4x what the model consumes, so that training never waits for data.

    python bench/input_pipeline.py [--images 256] [--batch 32] [--steps 5]
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import data  # noqa: E402
from keras_vit.training import distribute  # noqa: E402


def write_jpegs(root, count, seed=0):
    """`count` ImageNet-sized JPEGs (smooth random scenes, 375x500) in 2 class folders."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        coarse = rng.uniform(0, 255, (12, 16, 3)).astype("float32")
        scene = tf.image.resize(coarse[None], (375, 500), method="bicubic")[0]
        scene += rng.normal(0, 12, scene.shape)  # texture, so JPEGs are not trivially small
        folder = os.path.join(root, f"class_{i % 2}")
        os.makedirs(folder, exist_ok=True)
        pixels = tf.cast(tf.clip_by_value(scene, 0, 255), tf.uint8)
        tf.io.write_file(os.path.join(folder, f"{i:05d}.jpg"), tf.io.encode_jpeg(pixels, quality=90))


def pipeline_rate(root, batch, batches):
    source = data.load_source(root)
    stream = data.train_dataset(source, 224, batch, randaugment=(2, 15))
    iterator = iter(stream)
    next(iterator)  # tracing, thread pools, first shuffle buffer fill
    start = time.perf_counter()
    for _ in range(batches):
        images, _ = next(iterator)
    images.numpy()
    return batches * batch / (time.perf_counter() - start)


def training_rate(batch, steps):
    strategy = distribute.make_strategy("auto")
    with strategy.scope():
        model = keras_vit.ViT("Ti/16", image_size=224, num_classes=1000)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3, global_clipnorm=1.0),
            loss=keras.losses.CategoricalCrossentropy(from_logits=True),
            jit_compile=distribute.jit_allowed(strategy),
        )
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (batch, 224, 224, 3)).astype("float32")
    labels = np.eye(1000, dtype="float32")[rng.integers(0, 1000, batch)]
    model.train_on_batch(images, labels)  # compilation
    start = time.perf_counter()
    for _ in range(steps):
        model.train_on_batch(images, labels)
    return steps * batch / (time.perf_counter() - start), distribute.describe(strategy)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=256, help="JPEGs to write")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=16, help="pipeline batches to time")
    parser.add_argument("--steps", type=int, default=5, help="training steps to time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        write_jpegs(root, args.images)
        feed = pipeline_rate(root, args.batch, args.batches)
    print(f"input pipeline (decode + inception crop + RandAugment, 224 px): {feed:8.1f} images/s")
    consume, where = training_rate(args.batch, args.steps)
    print(f"ViT-Ti/16 training steps (224 px, batch {args.batch}, {where}): {consume:8.1f} images/s")
    print(f"ratio pipeline / training: {feed / consume:.1f}x (target >= 4x)")


if __name__ == "__main__":
    main()
