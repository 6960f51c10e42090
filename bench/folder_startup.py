"""Start-up on an image folder: time to the first training step against the number of files.

For each folder size, in one process, one after the other:
1. `load_source` without a cached listing (list the tree, read and check each file:
   `keras_vit.data.folders`),
2. `load_source` again (the listing cache, as a resume or another worker on the host),
3. from there to the first training step: `train_dataset` (224 px, inception crop, the
   whole folder in the shuffle buffer), its first batch, and one training step of a
   small ViT (the model's cost does not depend on the folder),
4. for comparison, what start-up cost before: decoding every file once (up to
   `--decode-limit` files; its per-file cost is constant).

The folders hold hard links to `--distinct` ImageNet-sized JPEGs (375x500, written
here), spread over 1000 class folders like ImageNet's: every file is its own directory
entry, so listing and checking cost what they cost on real files, but the data stays
small and sits in the page cache (a warm start; a cold disk adds its read latency to
both the check and the decode). Results go to stdout and `bench/results/folder_startup_CPU_DATE.json`.

    python bench/folder_startup.py [--sizes 1000 4000 16000 64000 200000]
"""

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import data  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.models import results_path  # noqa: E402

CLASSES = 1000


def write_distinct(folder, count, seed=0):
    """`count` smooth random 375x500 scenes with texture, as JPEGs of ImageNet's size."""
    os.makedirs(folder)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        coarse = rng.uniform(0, 255, (12, 16, 3)).astype("float32")
        scene = tf.image.resize(coarse[None], (375, 500), method="bicubic")[0]
        scene += rng.normal(0, 12, scene.shape)
        pixels = tf.cast(tf.clip_by_value(scene, 0, 255), tf.uint8)
        paths.append(os.path.join(folder, f"{i}.jpg"))
        tf.io.write_file(paths[-1], tf.io.encode_jpeg(pixels, quality=90))
    return paths


def link_tree(root, distinct, count):
    """`count` files in `CLASSES` class folders, hard links to the `distinct` JPEGs."""
    for c in range(CLASSES):
        os.makedirs(os.path.join(root, f"n{c:08d}"))
    for i in range(count):
        os.link(distinct[i % len(distinct)], os.path.join(root, f"n{i % CLASSES:08d}", f"{i:07d}.JPEG"))


def decode_all(root):
    """The former start-up: every file decoded once, in parallel (tf.data, all cores)."""
    paths = [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]
    shapes = (
        tf.data.Dataset.from_tensor_slices(paths)
        .map(lambda p: tf.shape(tf.io.decode_image(tf.io.read_file(p), expand_animations=False)),
             num_parallel_calls=tf.data.AUTOTUNE)
        .ignore_errors()
    )
    return sum(1 for _ in shapes.as_numpy_iterator())


def timed(function):
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000, 64000, 200000])
    parser.add_argument("--distinct", type=int, default=500, help="distinct JPEGs written")
    parser.add_argument("--decode-limit", type=int, default=16000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", help="default: bench/results/folder_startup_CPU_DATE.json")
    args = parser.parse_args()

    model = keras_vit.ViT(image_size=224, patch_size=32, hidden_dim=64, num_layers=2,
                          num_heads=2, mlp_dim=128, num_classes=CLASSES)
    model.compile(optimizer="adam", loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    rows = []
    with tempfile.TemporaryDirectory() as work:
        os.environ["KERAS_VIT_CACHE"] = os.path.join(work, "cache")
        distinct = write_distinct(os.path.join(work, "distinct"), args.distinct)
        jpeg_kib = np.mean([os.path.getsize(p) for p in distinct]) / 1024

        def first_step(source):
            stream = data.train_dataset(source, 224, args.batch)
            model.train_on_batch(*next(iter(stream)))

        # The model's and tf.data's own start-up, once, outside the measurements.
        link_tree(os.path.join(work, "warm_up"), distinct, CLASSES)
        first_step(data.load_source(os.path.join(work, "warm_up")))
        for size in args.sizes:
            root = os.path.join(work, f"folder_{size}")
            link_tree(root, distinct, size)
            source, listing = timed(lambda: data.load_source(root))
            _, cached = timed(lambda: data.load_source(root))
            _, to_step = timed(lambda: first_step(source))
            row = dict(
                files=size, listing_s=round(listing, 3), cached_listing_s=round(cached, 3),
                first_step_after_listing_s=round(to_step, 3),
                time_to_first_step_s=round(listing + to_step, 3),
                listing_us_per_file=round(listing / size * 1e6, 1),
            )
            if size <= args.decode_limit:
                decoded, seconds = timed(lambda: decode_all(root))
                assert decoded == size
                row.update(decode_all_s=round(seconds, 3),
                           decode_us_per_file=round(seconds / size * 1e6, 1))
            rows.append(row)
            print(json.dumps(row), flush=True)
            shutil.rmtree(root)
    result = dict(
        machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        date=time.strftime("%Y-%m-%d"), command=" ".join([sys.executable.split("/")[-1]] + sys.argv),
        distinct_jpegs=args.distinct, jpeg_kib=round(jpeg_kib, 1), classes=CLASSES,
        batch=args.batch, rows=rows,
    )
    with open(args.out or results_path("folder_startup"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
