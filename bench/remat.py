"""What rematerialising the transformer blocks (`ViT(remat=True)`) saves, on JAX.

    python bench/remat.py                   # ViT-Ti/16 at 224 px, batch 8 (about 2 minutes)
    python bench/remat.py --variant S/16 --batch 16

For the gradient of a training-mode forward pass, with and without `remat`:

- `residual_bytes`: the arrays JAX keeps from the forward pass for the backward pass
  (the leaves of `jax.vjp`'s backward function that are not the weights or the images),
  which is what remat trades for recomputation;
- `xla_temp_bytes`: the jitted gradient's scratch memory as XLA compiles it for this
  machine's backend (`compiled.memory_analysis().temp_size_in_bytes`), which also
  depends on how XLA schedules the recomputation.

Writes `bench/results/remat_CPU_DATE.json` (or `--out`).
"""

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

os.environ["KERAS_BACKEND"] = "jax"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import keras_vit  # noqa: E402

keras_vit.configure_for_backend()  # as the `keras-vit` command runs: freed memory kept

import jax  # noqa: E402

import keras  # noqa: E402

from bench.models import machine, results_path  # noqa: E402


def measure(remat, variant, image_size, batch):
    """`({"residual_bytes", "xla_temp_bytes"}, gradients)` of the sum of squared logits
    of a `variant` ViT (10 classes, seeded weights, random head) over `batch` seeded
    random images, `remat` or not."""
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(variant, image_size=image_size, num_classes=10, remat=remat)
    head = model.get_layer("head")  # zero-initialised: no gradient would reach the blocks
    head.kernel.assign(keras.random.normal(head.kernel.shape, seed=1))
    images = keras.random.uniform((batch, image_size, image_size, 3), -1, 1, seed=2)
    trainable = [v.value for v in model.trainable_variables]
    fixed = [v.value for v in model.non_trainable_variables]

    def loss(trainable):
        logits, _ = model.stateless_call(trainable, fixed, images, training=True)
        return (logits ** 2).sum()

    _, backward = jax.vjp(loss, trainable)
    inputs = {id(a) for a in (*trainable, *fixed, images)}
    residuals = [a for a in jax.tree_util.tree_leaves(backward) if id(a) not in inputs]
    gradient = jax.jit(jax.grad(loss))
    compiled = gradient.lower(trainable).compile()
    return {
        "residual_bytes": int(sum(a.nbytes for a in residuals)),
        "xla_temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes),
    }, gradient(trainable)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="Ti/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", default=results_path("remat"))
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc)
    rows, gradients = {}, {}
    for name, remat in (("without", False), ("remat", True)):
        rows[name], gradients[name] = measure(remat, args.variant, args.image_size, args.batch)
    # Remat recomputes the same operations: the gradients agree to float32 rounding.
    scale = max(float(abs(g).max()) for g in gradients["without"])
    difference = max(
        float(abs(a - b).max()) for a, b in zip(gradients["without"], gradients["remat"])
    )
    result = {
        "command": "python bench/remat.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "backend": jax.default_backend(),
        "variant": args.variant,
        "image_size": args.image_size,
        "batch": args.batch,
        **rows,
        "gradient_max_difference": difference,
        "gradient_max_abs": scale,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for name, row in rows.items():
        print(f"{name:8s} residuals {row['residual_bytes'] / 2**20:9.1f} MiB   "
              f"XLA temp {row['xla_temp_bytes'] / 2**20:9.1f} MiB")
    print(f"gradients: max difference {difference:.3g} (largest {scale:.3g})")


if __name__ == "__main__":
    main()
