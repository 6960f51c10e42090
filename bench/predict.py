"""Batch prediction on a folder of JPEGs: `keras-vit predict`'s engine against HF's pipeline.

Writes the same randomly initialised ViT as an HF transformers checkpoint
(`ViTForImageClassification` + `ViTImageProcessor`: bilinear resize to the model's size,
scaled to [-1, 1], as keras-vit preprocesses) and a folder of JPEGs of mixed sizes, then
runs each contender in a fresh process on the same files:

- `keras-BACKEND`: `keras_vit.classify(model, folder, batch_size=B, precision=P)` (what
  `keras-vit predict FOLDER --precision P` runs), the model built by `keras_vit.ViT` and
  loaded from the HF checkpoint by `keras_vit.load_pretrained`;
- `hf-pipeline`: `transformers.pipeline("image-classification", model=DIR, batch_size=B)`
  on the list of files, PyTorch with `torch.set_num_threads(cores)`; in bfloat16 with
  `dtype=torch.bfloat16` (the weights and the computation in bfloat16).

Each contender runs in each precision of `--precisions` (float32, bfloat16). Each worker
reports its start-up (from the process start to its first prediction, one image,
imports and model loading included) and then the images/s over the whole folder,
against HF's pipeline in float32 (its default) and in the row's precision. The top-1
agreement is reported with HF's pipeline in float32 (the resizes differ: PIL's bilinear
filter antialiases a downscale, TensorFlow's does not) and with the same contender in
float32 (what bfloat16 changes). The machine's CPU model and flags are recorded.

    python bench/predict.py [--images 1000] [--variant Ti/16] [--batch 32]
                            [--contenders keras-tensorflow,keras-jax,keras-torch,hf-pipeline]
                            [--precisions float32,bfloat16] [--out FILE]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.models import machine, results_path  # noqa: E402

CONTENDERS = ("keras-tensorflow", "keras-jax", "keras-torch", "hf-pipeline")
PRECISIONS = ("float32", "bfloat16")
IMAGE_SIZE = 224
NUM_CLASSES = 1000


def write_checkpoint(folder, variant):
    """A random ViT (`variant`, 224 px, 1000 classes) saved as HF transformers does."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    from keras_vit.models.variants import SIZES

    size, patch = variant.split("/")
    hidden_dim, mlp_dim, num_heads, num_layers = SIZES[size]
    config = ViTConfig(
        hidden_size=hidden_dim, num_hidden_layers=num_layers, num_attention_heads=num_heads,
        intermediate_size=mlp_dim, patch_size=int(patch), image_size=IMAGE_SIZE, num_labels=NUM_CLASSES,
        layer_norm_eps=1e-6, id2label={i: f"class {i}" for i in range(NUM_CLASSES)},
    )
    torch.manual_seed(0)
    ViTForImageClassification(config).save_pretrained(folder)
    ViTImageProcessor(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, resample=2,  # PIL bilinear
        image_mean=[0.5] * 3, image_std=[0.5] * 3,
    ).save_pretrained(folder)


def write_images(folder, count, seed=0):
    """`count` JPEGs of mixed sizes (sides 160 to 640 px), smooth scenes with texture."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for i in range(count):
        height, width = rng.integers(160, 641, size=2)
        coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype="uint8"))
        scene = np.asarray(coarse.resize((int(width), int(height)), Image.BICUBIC), "float32")
        scene = np.clip(scene + rng.normal(0, 12, scene.shape), 0, 255).astype("uint8")
        Image.fromarray(scene).save(os.path.join(folder, f"{i:05d}.jpg"), quality=90)


def worker(contender, precision, variant, checkpoint, images, batch):
    """Runs one contender in `precision`; prints `{"first": time}` after its first
    prediction, then `{"seconds": s, "top1": [...]}` for the whole folder."""
    paths = sorted(str(p) for p in Path(images).glob("*.jpg"))
    if contender == "hf-pipeline":
        import torch
        from transformers import pipeline

        torch.set_num_threads(os.cpu_count())
        classifier = pipeline("image-classification", model=checkpoint, batch_size=batch,
                              device="cpu", dtype=getattr(torch, precision))
        classifier(paths[:1])
        print(json.dumps({"first": time.time()}), flush=True)
        start = time.perf_counter()
        results = classifier(paths, top_k=1)
        seconds = time.perf_counter() - start
        top1 = [int(r[0]["label"].split()[-1]) for r in results]
    else:
        import keras_vit

        keras_vit.configure_for_backend()
        model = keras_vit.ViT(variant, image_size=IMAGE_SIZE, num_classes=NUM_CLASSES)
        keras_vit.load_pretrained(model, checkpoint)
        keras_vit.classify(model, paths[:1], precision=precision)
        print(json.dumps({"first": time.time()}), flush=True)
        start = time.perf_counter()
        results = keras_vit.classify(model, paths, top_k=1, batch_size=batch, precision=precision)
        seconds = time.perf_counter() - start
        top1 = [r["top_k"][0]["class"] for r in results]
    print(json.dumps({"seconds": seconds, "top1": top1}), flush=True)


def run(contender, precision, variant, checkpoint, images, batch):
    """Starts a worker process; returns its start-up seconds, seconds and top-1 classes."""
    backend = contender.split("-", 1)[1] if contender.startswith("keras-") else "torch"
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, __file__, "--worker", contender, "--precision", precision,
               "--variant", variant,
               "--checkpoint", checkpoint, "--image-folder", images, "--batch", str(batch)]
    started = time.time()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{contender} failed:\n{result.stderr[-3000:]}")
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    first, done = lines[0], lines[-1]
    return dict(startup_s=first["first"] - started, seconds=done["seconds"], top1=done["top1"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--variant", default="Ti/16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--out", default=results_path("predict"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--image-folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.precision, args.variant, args.checkpoint,
                      args.image_folder, args.batch)
    contenders, precisions = args.contenders.split(","), args.precisions.split(",")
    for name, given, known in (("contenders", contenders, CONTENDERS),
                               ("precisions", precisions, PRECISIONS)):
        unknown = sorted(set(given) - set(known))
        if unknown:
            parser.error(f"--{name}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    with tempfile.TemporaryDirectory(prefix="keras_vit_predict_bench_") as folder:
        checkpoint, images = os.path.join(folder, "checkpoint"), os.path.join(folder, "images")
        write_checkpoint(checkpoint, args.variant)
        write_images(images, args.images)
        results = {(c, p): run(c, p, args.variant, checkpoint, images, args.batch)
                   for p in precisions for c in contenders}

    def agreement(result, reference):
        return sum(a == b for a, b in zip(result["top1"], reference["top1"])) / args.images

    hf = results.get(("hf-pipeline", "float32"))
    rows = []
    for (contender, precision), result in results.items():
        row = dict(
            contender=contender, precision=precision, images=args.images, variant=args.variant,
            batch=args.batch, startup_s=round(result["startup_s"], 2),
            images_per_s=round(args.images / result["seconds"], 2),
        )
        same, own = results.get(("hf-pipeline", precision)), results.get((contender, "float32"))
        if hf is not None:
            row["x_hf_pipeline"] = round(hf["seconds"] / result["seconds"], 3)
            row["top1_agreement_hf_pipeline"] = agreement(result, hf)
        if same is not None:
            row["x_hf_pipeline_same_precision"] = round(same["seconds"] / result["seconds"], 3)
        if own is not None and precision != "float32":
            row["top1_agreement_float32"] = agreement(result, own)
        rows.append(row)
    report = dict(machine=machine(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  rows=rows, table=format_table(rows))
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['machine']['cpu']} ({', '.join(report['machine']['cpu_flags'])}), "
          f"{report['machine']['cores']} cores; {args.variant} at {IMAGE_SIZE} px, "
          f"{args.images} JPEGs, batch {args.batch}")
    print(report["table"])
    return 0


def format_table(rows):
    """The result rows as a Markdown table (printed, and kept in the result file)."""
    lines = ["| contender | precision | start-up s | images/s | x HF pipeline (float32) "
             "| x HF pipeline (same precision) | top-1 agreement with HF (float32) "
             "| top-1 agreement with its float32 |",
             "|---|---|---|---|---|---|---|---|"]

    def cell(row, key, digits):
        return f"{row[key]:.{digits}f}" if key in row else ""

    for row in rows:
        lines.append(
            f"| {row['contender']} | {row['precision']} | {row['startup_s']:.1f} "
            f"| {row['images_per_s']:.1f} | {cell(row, 'x_hf_pipeline', 2)} "
            f"| {cell(row, 'x_hf_pipeline_same_precision', 2)} "
            f"| {cell(row, 'top1_agreement_hf_pipeline', 3)} "
            f"| {cell(row, 'top1_agreement_float32', 3)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
