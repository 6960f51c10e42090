"""Where a training step's memory goes: the same contenders as `bench/models.py`,
each in a fresh process at two batch sizes.

    python bench/memory.py                  # ViT-S/16 at 224 px (about 8 minutes on 2 cores)
    python bench/memory.py --variant Ti/16 --contenders keras-jax,hf-torch

Every contender (`bench/contenders.py`) builds the model, runs one inference step and
then two AdamW training steps, at a small batch and at the benchmark's batch, each in a
process of its own; the resident-set high-water marks after each phase separate a
framework's fixed cost (its import, the model, the optimizer, compiled programs) from
what every further image adds (the activations kept for the backward pass):
`per image = (train peak at the large batch - at the small one) / (batch difference)`.
Writes `bench/results/memory_CPU_DATE.json`.
"""

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.contenders import CONTENDERS  # noqa: E402
from bench.models import BATCH, Worker, chosen, driver_backend, machine, results_path  # noqa: E402

SMALL_BATCH = 2


def measure(contender, arch, image_size, batch, log_dir):
    """Peak RSS (MiB) of a fresh `contender` process after building the model, one
    inference step and two training steps at `batch`."""
    worker = Worker(contender, log_dir)
    try:
        peaks = {"build": worker.ask(op="setup", arch=arch, image_size=image_size,
                                     batch=batch, precision="float32")["peak_rss_mib"]}
        peaks["infer"] = worker.ask(op="prepare", mode="infer", warmup=1)["peak_rss_mib"]
        peaks["train"] = worker.ask(op="prepare", mode="train", warmup=2)["peak_rss_mib"]
    finally:
        worker.close()
    return peaks


def main(argv=None):
    driver_backend()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="S/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--out", default=results_path("memory"))
    args = parser.parse_args(argv)
    contenders = chosen(parser, "contenders", args.contenders, CONTENDERS)
    from keras_vit.models.vit import parse_variant

    arch = parse_variant(args.variant)
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = []
    with tempfile.TemporaryDirectory() as log_dir:
        for contender in contenders:
            small, large = (
                measure(contender, arch, args.image_size, batch, log_dir)
                for batch in (SMALL_BATCH, BATCH)
            )
            rows.append(dict(
                contender=contender, peaks_mib={SMALL_BATCH: small, BATCH: large},
                train_per_image_mib=(large["train"] - small["train"]) / (BATCH - SMALL_BATCH),
            ))
            print(f"{contender}: {rows[-1]}", file=sys.stderr, flush=True)
    reference = next((r for r in rows if r["contender"] == "hf-torch"), None)
    lines = [
        f"{args.variant} at {args.image_size} px, float32, AdamW training; peak RSS in MiB",
        "",
        f"| contender | build | inference (batch {BATCH}) | train, batch {SMALL_BATCH} "
        f"| train, batch {BATCH} | x HF | per image |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        small, large = r["peaks_mib"][SMALL_BATCH], r["peaks_mib"][BATCH]
        ratio = f"{large['train'] / reference['peaks_mib'][BATCH]['train']:.2f}" if reference else ""
        lines.append(
            f"| {r['contender']} | {large['build']:.0f} | {large['infer']:.0f} "
            f"| {small['train']:.0f} | {large['train']:.0f} | {ratio} "
            f"| {r['train_per_image_mib']:.1f} |"
        )
    table = "\n".join(lines)
    print(table)
    Path(args.out).write_text(json.dumps(dict(
        command=" ".join(["python bench/memory.py", *(sys.argv[1:] if argv is None else argv)]),
        started=started.isoformat(timespec="seconds"),
        machine=machine(),
        variant=args.variant,
        image_size=args.image_size,
        rows=rows,
        table=table,
    ), indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
