"""NaFlex (native aspect ratio) against fixed resolution at an equal token budget per
batch, in patch tokens per second, on each Keras backend and against timm's `NaFlexVit`.

Every batch has `--batch` rows of `--budget` token slots (a SigLIP-style `--variant`:
MAP head, tanh GELU, learned position table; random weights, 1000 classes):

- `fixed`: `keras_vit.ViT(variant, image_size=S)` on square images, (S / P)^2 = budget
  patches each: every slot is a real token;
- `padded`: `keras_vit.ViT(variant, naflex=True)` on images of mixed aspect ratios
  (1:3 to 3:1), each resized by `keras_vit.naflex_inputs` to the largest grid within the
  budget and padded to it: one image per row;
- `packed`: `keras_vit.ViT(variant, naflex=True, images_per_row=K)` on images of mixed
  aspect ratios and sizes (an eighth of the budget to half of it, as NaViT's resolution
  sampling gives), up to K a row (`--images-per-row`), rows filled first-fit to the
  budget by `keras_vit.data.naflex.pack_rows` (the training pipelines' packing).

Tokens per second count real patch tokens only (padding is work done for nothing), so
`padded` and `packed` pay for their padding; the target is each >= 0.9x `fixed` on the
same backend. Inference times `predict_on_batch`, training `train_on_batch` (AdamW,
softmax cross-entropy), each with the model's default compilation (`jit_compile="auto"`).
Each contender runs in its own process; within it the modes alternate, rotating their
order every round, and a mode's ratio to `fixed` is the median of its per-round ratios.
`timm-naflexvit` is timm's `NaFlexVit` (`naflexvit_base_patch16_siglip`'s architecture at
the variant's sizes) on the same padded inputs and square images in PyTorch, run by
`--timm-python` (a Python where `import timm` works; skipped where none does).

    python bench/naflex.py [--variant Ti/16] [--budget 256] [--batch 8] [--rounds 3]
        [--images-per-row 6] [--steps 2] [--num-layers N]
        [--contenders keras-tensorflow,keras-jax,keras-torch,timm-naflexvit]
        [--timm-python PATH] [--out FILE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.models import driver_backend, machine, results_path  # noqa: E402

CONTENDERS = ("keras-tensorflow", "keras-jax", "keras-torch", "timm-naflexvit")
MODES = ("fixed", "padded", "packed")
NUM_CLASSES = 1000
TORCH_THREADS = 2
TIMM_MODEL = "naflexvit_base_patch16_siglip"


def mixed_images(count, seed, min_pixels, max_pixels):
    """`count` random uint8 images of aspect ratios 1:3 to 3:1 and about `min_pixels`
    to `max_pixels` pixels (their content does not change the cost)."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        aspect = float(np.exp(rng.uniform(np.log(1 / 3), np.log(3))))
        pixels = rng.uniform(min_pixels, max_pixels)
        height = max(8, int(round((pixels / aspect) ** 0.5)))
        width = max(8, int(round((pixels * aspect) ** 0.5)))
        images.append(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    return images


def make_data(path, variant, budget, batch, images_per_row, num_layers=None, seed=0):
    """Writes every contender's inputs to `path` (.npz): the padded and packed NaFlex
    batches, their real token counts, and the square images' side."""
    from keras_vit import naflex_inputs
    from keras_vit.data.naflex import pack_rows
    from keras_vit.models.vit import parse_variant

    arch = parse_variant(variant)
    arch["num_layers"] = num_layers or arch["num_layers"]
    patch = arch["patch_size"]
    side = patch * int(round(budget**0.5))
    if (side // patch) ** 2 != budget:
        raise SystemExit(f"--budget {budget} is not a square number of patches: pick e.g. 256.")
    area = side * side
    padded = naflex_inputs(mixed_images(batch, seed, area / 2, area * 2), patch, budget)
    # Each packed image gets its own budget, an eighth of the row's to half of it (smaller
    # images, as NaViT's resolution sampling gives, are what packing is for); the rows are
    # filled first-fit (`pack_rows`, as the training pipelines pack) from twice as many
    # images as the rows have slots.
    budgets = np.random.default_rng(seed + 2).integers(budget // 8, budget // 2 + 1,
                                                       2 * batch * images_per_row)
    singles = [naflex_inputs([image], patch, int(b)) for image, b in
               zip(mixed_images(len(budgets), seed + 1, area / 4, area * 2), budgets)]
    patches = np.zeros((len(singles), budget, singles[0]["patches"].shape[-1]), np.float32)
    for i, inputs in enumerate(singles):
        patches[i, : inputs["patches"].shape[1]] = inputs["patches"][0]
    packed, index = pack_rows(patches, [int(x["patch_mask"].sum()) for x in singles],
                              [x["spatial_shapes"][0] for x in singles], batch, budget,
                              images_per_row)
    placed = int((index >= 0).sum())
    np.savez(path, side=side, patch=patch,
             sizes=[arch[k] for k in ("hidden_dim", "mlp_dim", "num_heads", "num_layers")],
             padded_patches=padded["patches"], padded_mask=padded["patch_mask"],
             padded_shapes=padded["spatial_shapes"],
             packed_patches=packed["patches"], packed_mask=packed["patch_mask"],
             packed_shapes=packed["spatial_shapes"], packed_images=placed)


def keras_runners(data, batch, images_per_row):
    """`{mode: (infer, train, real tokens per batch)}` for keras-vit on this backend."""
    import keras

    import keras_vit

    keras_vit.configure_for_backend()
    side = int(data["side"])
    hidden, mlp, heads, layers = (int(v) for v in data["sizes"])
    family = dict(classifier="map", gelu_approximate=True, num_classes=NUM_CLASSES,
                  image_size=side, patch_size=int(data["patch"]), hidden_dim=hidden,
                  mlp_dim=mlp, num_heads=heads, num_layers=layers)
    labels = np.arange(batch) % NUM_CLASSES
    models = {
        "fixed": (keras_vit.ViT(**family),
                  np.random.default_rng(0).uniform(-1, 1, (batch, side, side, 3)).astype("float32"),
                  labels, None, batch * (side // int(data["patch"])) ** 2),
        "padded": (keras_vit.ViT(naflex=True, **family),
                   {"patches": data["padded_patches"], "patch_mask": data["padded_mask"],
                    "spatial_shapes": data["padded_shapes"]},
                   labels, None, int(data["padded_mask"].sum())),
    }
    weights = (data["packed_shapes"].prod(axis=-1) > 0).astype("float32")  # real slots
    models["packed"] = (
        keras_vit.ViT(naflex=True, images_per_row=images_per_row, **family),
        {"patches": data["packed_patches"], "patch_mask": data["packed_mask"],
         "spatial_shapes": data["packed_shapes"]},
        np.zeros((batch, images_per_row), "int32") + labels[:, None], weights,
        int((data["packed_mask"] > 0).sum()),
    )
    runners = {}
    for mode, (model, x, y, weight, tokens) in models.items():
        model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        infer = (lambda m, x: lambda: keras.ops.convert_to_numpy(m.predict_on_batch(x)))(model, x)
        train = (lambda m, x, y, w: lambda: m.train_on_batch(x, y, sample_weight=w))(
            model, x, y, weight)
        runners[mode] = (infer, train, tokens)
    return runners


def timm_runners(data, batch):
    """`{mode: (infer, train, real tokens per batch)}` for timm's NaFlexVit in PyTorch, of
    the sizes the driver wrote into `data` (timm's Python may have no Keras)."""
    import timm
    import torch

    torch.set_num_threads(TORCH_THREADS)
    hidden, mlp, heads, layers = (int(v) for v in data["sizes"])
    side, patch = int(data["side"]), int(data["patch"])
    model = timm.create_model(TIMM_MODEL, embed_dim=hidden, depth=layers, num_heads=heads,
                              mlp_ratio=mlp / hidden, patch_size=patch, num_classes=NUM_CLASSES,
                              pos_embed_grid_size=(side // patch, side // patch))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    labels = torch.arange(batch) % NUM_CLASSES
    shapes = data["padded_shapes"]
    index = np.arange(data["padded_mask"].shape[1])[None, :]
    rows, cols = index // shapes[:, 1:2], index % shapes[:, 1:2]
    valid = data["padded_mask"] > 0
    coords = np.stack([rows * valid, cols * valid], axis=-1)
    inputs = {
        "fixed": torch.from_numpy(np.random.default_rng(0).uniform(
            -1, 1, (batch, 3, side, side)).astype("float32")),
        "padded": {"patches": torch.from_numpy(data["padded_patches"]),
                   "patch_coord": torch.from_numpy(coords.astype("int64")),
                   "patch_valid": torch.from_numpy(valid)},
    }
    tokens = {"fixed": batch * (side // patch) ** 2, "padded": int(valid.sum())}

    def infer(x):
        def run():
            model.eval()
            with torch.inference_mode():
                model(x)
        return run

    def train(x):
        def run():
            model.train()
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), labels).backward()
            optimizer.step()
        return run

    return {mode: (infer(x), train(x), tokens[mode]) for mode, x in inputs.items()}


def timed(run, steps):
    start = time.perf_counter()
    for _ in range(steps):
        run()
    return (time.perf_counter() - start) / steps


def worker(contender, data_path, batch, images_per_row, rounds, steps, warmup):
    """Times every mode of `contender`, alternated; prints one JSON line of results."""
    data = dict(np.load(data_path))
    if contender == "timm-naflexvit":
        runners = timm_runners(data, batch)
    else:
        runners = keras_runners(data, batch, images_per_row)
    results = {}
    for task, pick in (("infer", 0), ("train", 1)):
        modes = list(runners)
        for mode in modes:
            for _ in range(warmup):
                runners[mode][pick]()
        seconds = {mode: [] for mode in modes}
        for r in range(rounds):
            for mode in modes[r % len(modes):] + modes[: r % len(modes)]:
                seconds[mode].append(timed(runners[mode][pick], steps))
        for mode in modes:
            tokens = runners[mode][2]
            results[f"{task}/{mode}"] = dict(
                step_s=statistics.median(seconds[mode]),
                tokens_per_s=statistics.median(tokens / s for s in seconds[mode]),
                x_fixed=statistics.median(
                    (tokens / s) / (runners["fixed"][2] / f)
                    for s, f in zip(seconds[mode], seconds["fixed"])),
            )
    print(json.dumps(results), flush=True)


def run(contender, args, data_path, python):
    backend = contender.split("-", 1)[1] if contender.startswith("keras-") else "torch"
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": str(ROOT)}
    command = [python, __file__, "--worker", contender, "--data", data_path, "--batch", str(args.batch), "--rounds", str(args.rounds),
               "--images-per-row", str(args.images_per_row), "--steps", str(args.steps)]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{contender} failed:\n{result.stderr[-3000:]}")
    return json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])


def timm_python(path):
    """The Python that runs timm: `path`, else this one where `import timm` works."""
    for python in ([path] if path else []) + [sys.executable]:
        found = subprocess.run([python, "-c", "import timm, torch; print(timm.__version__, "
                                "torch.__version__)"], capture_output=True, text=True)
        if found.returncode == 0:
            return python, found.stdout.split()
    return None, None


def format_table(contenders):
    lines = ["| contender | task | mode | tokens/s | x fixed |", "|---|---|---|---|---|"]
    for contender, results in contenders.items():
        for key, row in results.items():
            task, mode = key.split("/")
            lines.append(f"| {contender} | {task} | {mode} | {row['tokens_per_s']:.0f} | "
                         f"{row['x_fixed']:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    driver_backend()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="Ti/16")
    parser.add_argument("--num-layers", type=int, help="fewer blocks than the variant's")
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--images-per-row", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--timm-python", help="a Python where `import timm` works")
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.data, args.batch, args.images_per_row,
                      args.rounds, args.steps, warmup=2)
    contenders = args.contenders.split(",")
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown:
        parser.error(f"--contenders: unknown {', '.join(unknown)}; "
                     f"choose from {', '.join(CONTENDERS)}")
    results, notes = {}, {}
    with tempfile.TemporaryDirectory(prefix="keras_vit_naflex_bench_") as folder:
        data_path = os.path.join(folder, "data.npz")
        make_data(data_path, args.variant, args.budget, args.batch, args.images_per_row,
                  args.num_layers)
        data = np.load(data_path)
        batches = dict(  # what one batch of each mode holds
            fixed=dict(images=args.batch, tokens=args.batch * args.budget),
            padded=dict(images=args.batch, tokens=int(data["padded_mask"].sum())),
            packed=dict(images=int(data["packed_images"]),
                        tokens=int((data["packed_mask"] > 0).sum())),
        )
        for contender in contenders:
            python = sys.executable
            if contender == "timm-naflexvit":
                python, versions = timm_python(args.timm_python)
                if python is None:
                    notes[contender] = "skipped: timm does not import here (--timm-python)"
                    continue
                notes[contender] = f"timm {versions[0]}, torch {versions[1]} ({python})"
            results[contender] = run(contender, args, data_path, python)
    report = dict(machine=machine(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  settings=dict(variant=args.variant, num_layers=args.num_layers,
                                budget=args.budget, batch=args.batch,
                                images_per_row=args.images_per_row, rounds=args.rounds,
                                steps=args.steps),
                  batches=batches,
                  notes=notes, results=results, table=format_table(results))
    if "timm-naflexvit" in results and "keras-torch" in results:
        report["keras_torch_x_timm"] = {
            key: round(results["keras-torch"][key]["tokens_per_s"] / row["tokens_per_s"], 3)
            for key, row in results["timm-naflexvit"].items() if key in results["keras-torch"]}
    out = args.out or results_path("naflex")
    Path(out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['machine']['cpu']} ({', '.join(report['machine']['cpu_flags'])}), "
          f"{report['machine']['cores']} cores; {args.variant}, {args.budget} tokens per row, "
          f"batch {args.batch}; real tokens (images) per batch: "
          + ", ".join(f"{m} {b['tokens']} ({b['images']})" for m, b in batches.items()))
    print(report["table"])
    for contender, note in notes.items():
        print(f"{contender}: {note}")
    if "keras_torch_x_timm" in report:
        print("keras-torch x timm-naflexvit:", report["keras_torch_x_timm"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
