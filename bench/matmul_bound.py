"""How fast keras-vit could run on TensorFlow if everything but its matrix products were free.

    python bench/matmul_bound.py                  # Ti/16 and S/16 at 224: inference, training
    python bench/matmul_bound.py --variant Ti/16 --modes infer --rounds 2

A ViT step is almost all matrix products. This run lists every product of one step
(forward; for training also the two gradient products of each), times each alone under
XLA on TensorFlow (jit-compiled, float32, with the transposes that the model's graph
hands to XLA; the two gradients of a product together, as the step's XLA program runs
them side by side), and sums them: about the time a step would take if all its other
work were free. (Inference runs its products one after another, so the sum bounds the
step; a training step can also fit other work into the cycles that its gradient
products leave idle.) The sum is set beside keras-vit's whole step and HF transformers'
step, timed by `bench/contenders.py` workers in the same run, rounds alternating as in
`bench/models.py`. The table says how much of the step is matrix products, at what
fraction of the machine's matmul peak each runs, and the best ratio to HF that XLA's
products allow. Writes `bench/results/matmul_bound_CPU_DATE.json`.
"""

import argparse
import collections
import datetime
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from bench.contenders import timed, matmul_gflops  # noqa: E402
from bench.models import BATCH, REFERENCE, Worker, machine, results_path  # noqa: E402

CONTENDER = "keras-tensorflow"
REPEATS = 5

# One product: (name, (batch dims...), m, k, n, transpose_a, transpose_b, count in a step).
Product = collections.namedtuple("Product", "name batch m k n transpose_a transpose_b count")


def step_products(arch, image_size, batch, mode, num_classes=1000):
    """The matrix products of one ViT step, as `tf.matmul` sees them in keras-vit's graph.

    Returns groups of products that the step can run side by side: each forward product
    alone (each needs the one before it) and, for training, the two gradients of each
    product `y = a @ b`, `dy @ b^T` and `a^T @ dy` (only the latter for the patch
    projection, whose input is the images). Forward, each `Dense` is `x @ W` (rows =
    batch * tokens) and attention is `q @ k^T` and `weights @ v`, batched over
    (batch, heads).

    Example:

    >>> from keras_vit.models.vit import parse_variant
    >>> groups = step_products(parse_variant("Ti/16"), 224, 32, "train")
    >>> [(p.name, p.m, p.k, p.n, p.count) for p in groups[1]]
    [('qkv', 6304, 192, 576, 12)]
    >>> [p.name for p in groups[9]]
    ['qkv da', 'qkv db']
    """
    patches = (image_size // arch["patch_size"]) ** 2
    tokens, width, layers = patches + 1, arch["hidden_dim"], arch["num_layers"]
    heads = arch["num_heads"]
    rows, head_dim = batch * tokens, width // heads
    patch_dim = arch["patch_size"] ** 2 * 3
    forward = [
        Product("patch projection", (), batch * patches, patch_dim, width, False, False, 1),
        Product("qkv", (), rows, width, 3 * width, False, False, layers),
        Product("attention q.k", (batch, heads), tokens, head_dim, tokens, False, True, layers),
        Product("attention w.v", (batch, heads), tokens, tokens, head_dim, False, False, layers),
        Product("attention output", (), rows, width, width, False, False, layers),
        Product("mlp fc1", (), rows, width, arch["mlp_dim"], False, False, layers),
        Product("mlp fc2", (), rows, arch["mlp_dim"], width, False, False, layers),
        Product("head", (), batch, width, num_classes, False, False, 1),
    ]
    if mode == "infer":
        return [[p] for p in forward]
    gradients = []
    for p in forward:
        backward = []
        # y[m, n] = a[m, k] @ b[k, n] (b given transposed when transpose_b):
        # da[m, k] = dy[m, n] @ b^T, db[k, n] = a^T @ dy (or db^T = dy^T @ a).
        if p.name != "patch projection":
            backward.append(
                p._replace(name=f"{p.name} da", k=p.n, n=p.k, transpose_b=not p.transpose_b)
            )
        if p.transpose_b:
            db = dict(m=p.n, k=p.m, n=p.k, transpose_b=False)
        else:
            db = dict(m=p.k, k=p.m, n=p.n)
        backward.append(p._replace(name=f"{p.name} db", transpose_a=True, **db))
        gradients.append(backward)
    return [[p] for p in forward] + gradients


def flops(product):
    return 2 * product.m * product.k * product.n * product.count * math.prod(product.batch)


def product_program(group):
    """A compiled XLA program (TensorFlow) running the products in `group` once."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    operands = []
    for p in group:
        a_shape = (p.k, p.m) if p.transpose_a else (p.m, p.k)
        b_shape = (p.n, p.k) if p.transpose_b else (p.k, p.n)
        shapes = (p.batch + a_shape, p.batch + b_shape)
        operands.append([tf.constant(rng.uniform(size=shape), "float32") for shape in shapes])

    def products():
        total = 0.0
        for p, (a, b) in zip(group, operands):
            y = tf.matmul(a, b, transpose_a=p.transpose_a, transpose_b=p.transpose_b)
            # Hand back one row: a fresh output tensor per call (14 MiB for qkv) costs
            # an allocation and its page faults, 8% of qkv's time, which the model's
            # step, one XLA program, does not pay.
            total += tf.reduce_sum(y[..., :1, :])
        return total

    compiled = tf.function(products, jit_compile=True, autograph=False)
    compiled().numpy()
    return lambda: compiled().numpy()


def measure(variant, image_size, mode, rounds, log_dir, echo):
    """Alternates keras-vit's step, HF's step and the product timings for `rounds` rounds."""
    from keras_vit.models.vit import parse_variant

    arch = parse_variant(variant)
    groups = step_products(arch, image_size, BATCH, mode)
    workers = {c: Worker(c, log_dir) for c in (CONTENDER, REFERENCE)}
    steps = {c: [] for c in workers}
    programs = [product_program(group) for group in groups]
    group_s = [[] for _ in groups]
    peaks = []
    try:
        for worker in workers.values():
            worker.send(op="setup", arch=arch, image_size=image_size, batch=BATCH)
            worker.receive()
            worker.ask(op="prepare", mode=mode, warmup=2)
        for r in range(rounds):
            for contender, worker in workers.items():
                steps[contender] += worker.ask(op="round", steps=2)["step_s"]
            for run, seconds in zip(programs, group_s):
                seconds.append(min(timed(run) for _ in range(REPEATS)))
            peaks.append(matmul_gflops("tensorflow"))
            products_ms = 1e3 * sum(g[0].count * s[-1] for g, s in zip(groups, group_s))
            echo(
                f"{variant} {image_size}px {mode} round {r + 1}: "
                + ", ".join(f"{c} {1e3 * min(s):.0f} ms" for c, s in steps.items())
                + f", products {products_ms:.0f} ms"
            )
    finally:
        for worker in workers.values():
            worker.close()
    rows = []
    for group, times in zip(groups, group_s):
        seconds = statistics.median(times) * group[0].count
        gflop = sum(flops(p) for p in group) / 1e9
        rows.append(
            dict(
                products=[{**p._asdict(), "batch": list(p.batch)} for p in group],
                count=group[0].count,
                gflop=gflop,
                ms=1e3 * seconds,
                gflops_per_s=gflop / seconds,
            )
        )
    products_s = sum(row["ms"] for row in rows) / 1e3
    step_s = {c: statistics.median(s) for c, s in steps.items()}
    return dict(
        variant=variant,
        image_size=image_size,
        mode=mode,
        batch=BATCH,
        step_ms={c: 1e3 * s for c, s in step_s.items()},
        products_ms=1e3 * products_s,
        products_share_of_step=products_s / step_s[CONTENDER],
        ratio_vs_hf=step_s[REFERENCE] / step_s[CONTENDER],
        bound_ratio_vs_hf=step_s[REFERENCE] / products_s,
        # The best round: a probe that shares the machine reads low, never high.
        matmul_peak_gflops=max(peaks),
        matmul_probe_gflops=peaks,
        groups=rows,
    )


def _describe(product):
    batch = "x".join(map(str, product["batch"]))
    transposed = "".join(
        flag for flag, on in (("a", product["transpose_a"]), ("b", product["transpose_b"])) if on
    )
    return (
        f"{f'({batch}) ' if batch else ''}{product['m']} x {product['k']} x {product['n']}",
        transposed or "-",
    )


def format_result(result):
    peak, step_ms = result["matmul_peak_gflops"], result["step_ms"]
    lines = [
        f"### {result['variant']} at {result['image_size']} px, {result['mode']}, "
        f"batch {result['batch']} (XLA matmul peak {peak:.0f} GFLOP/s)",
        "",
        f"keras-tensorflow step {step_ms[CONTENDER]:.0f} ms ({result['ratio_vs_hf']:.2f}x "
        f"HF's {step_ms[REFERENCE]:.0f} ms); its matrix products alone "
        f"{result['products_ms']:.0f} ms ({100 * result['products_share_of_step']:.0f}% of "
        f"the step): at most {result['bound_ratio_vs_hf']:.2f}x HF with all else free.",
        "",
        "| products | (batch) m x k x n | transposed | per step | GFLOP | ms | GFLOP/s | % peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["groups"]:
        shapes, transposed = zip(*map(_describe, row["products"]))
        lines.append(
            f"| {' + '.join(p['name'] for p in row['products'])} | {' + '.join(shapes)} "
            f"| {' + '.join(transposed)} | {row['count']} | {row['gflop']:.1f} "
            f"| {row['ms']:.1f} | {row['gflops_per_s']:.0f} "
            f"| {100 * row['gflops_per_s'] / peak:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append", help="default: Ti/16 and S/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=results_path("matmul_bound"))
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in ("infer", "train")]
    if unknown:
        parser.error(f"unknown modes {unknown}: expected infer and/or train")
    echo = lambda text: print(text, file=sys.stderr, flush=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    results = []
    with tempfile.TemporaryDirectory() as log_dir:
        for variant in args.variant or ["Ti/16", "S/16"]:
            for mode in modes:
                results.append(measure(variant, args.image_size, mode, args.rounds, log_dir, echo))
    text = "\n\n".join(format_result(result) for result in results)
    print(text)
    Path(args.out).write_text(
        json.dumps(
            dict(
                command="python bench/matmul_bound.py",
                started=started.isoformat(timespec="seconds"),
                machine=machine(),
                results=results,
                table=text,
            ),
            indent=1,
        )
    )
    echo(f"wrote {args.out}")


if __name__ == "__main__":
    main()
