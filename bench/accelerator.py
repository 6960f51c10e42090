"""Benchmarks keras-vit against HF transformers on one GPU: ViT-B/16 in bfloat16.

    python bench/accelerator.py            # on a machine with a GPU (under 8 minutes)
    python bench/accelerator.py --smoke    # a tiny model on the CPU: keeps the script working

For each contender (keras-vit on TensorFlow, JAX and PyTorch; HF transformers' ViT with
SDPA attention under `torch.autocast`), in bfloat16 mixed precision: training-step and
inference images/s, and the model FLOP utilisation (MFU): FLOPs per image
(`keras_vit.forward_flops`, three times that for a training step) times images/s, over
the GPU's published dense bfloat16 peak, looked up by device name (`--peak-tflops`
overrides). Workers and rounds are those of `bench/models.py`: one process per
contender, rounds alternating between them, medians over rounds. Writes
`bench/results/accelerator_GPU_DATE.json` (or `--out`).
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("KERAS_BACKEND", "jax")  # the driver only counts FLOPs
# The contenders' processes share the GPU: each takes memory as it needs it, instead of
# JAX's 75% of the card up front or TensorFlow's all of it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")

from bench.contenders import CONTENDERS  # noqa: E402
from bench.models import chosen, machine, results_path, run_group, summarise  # noqa: E402

# Dense (no sparsity) bfloat16 tensor-core peaks in TFLOP/s from NVIDIA's data sheets,
# matched against the device name in this order (the first match wins).
PUBLISHED_BF16_TFLOPS = (
    ("H200", 989.4),
    ("H100 PCIe", 756.5),
    ("H100", 989.4),
    ("A100", 312.0),
    ("L40S", 362.1),
    ("L4", 121.0),
)
PLANS = {
    "gpu": dict(
        variant="B/16", arch=None, image_size=224, batch=128,
        rounds=3, steps={"infer": 10, "train": 10}, warmup=3,
    ),
    "smoke": dict(
        variant="tiny",
        arch=dict(patch_size=8, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=64),
        image_size=32, batch=4, rounds=1, steps={"infer": 1, "train": 1}, warmup=1,
    ),
}


def published_peak_tflops(device):
    """The dense bfloat16 peak of `device` (a name such as "NVIDIA H200"), or None.

    Example:

    >>> published_peak_tflops("NVIDIA H100 PCIe"), published_peak_tflops("cpu")
    (756.5, None)
    """
    for key, peak in PUBLISHED_BF16_TFLOPS:
        if key in device:
            return peak
    return None


def add_utilisation(entries, peak_tflops):
    """Sets each entry's `mfu`: model FLOP rate over `peak_tflops` (None without a peak).

    An entry's `flops_per_image` already counts a training step's backward pass.
    """
    for e in entries:
        rate = e["median_images_per_s"] * e["flops_per_image"]
        e["peak_tflops"] = peak_tflops
        e["mfu"] = None if peak_tflops is None else rate / (peak_tflops * 1e12)


def format_table(entries):
    lines = [
        "| model | contender | device | task | img/s | x HF | MFU |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        ratio, mfu = e.get("ratio_vs_hf"), e["mfu"]
        lines.append(
            f"| {e['variant']} | {e['contender']} | {e['device']} | {e['mode']} "
            f"| {e['median_images_per_s']:.1f} | {'' if ratio is None else f'{ratio:.2f}'} "
            f"| {'' if mfu is None else f'{100 * mfu:.1f}%'} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny model, on any machine")
    parser.add_argument("--out", help="default: bench/results/accelerator_GPU_DATE.json")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--peak-tflops", type=float, help="the device's bfloat16 peak")
    args = parser.parse_args(argv)
    contenders = chosen(parser, "contenders", args.contenders, CONTENDERS)
    plan = dict(PLANS["smoke" if args.smoke else "gpu"])
    if plan["arch"] is None:
        from keras_vit.models.vit import parse_variant

        plan["arch"] = parse_variant(plan["variant"])
    echo = lambda text: print(text, file=sys.stderr, flush=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    tasks = {"infer": (plan["image_size"],), "train": (plan["image_size"],)}
    with tempfile.TemporaryDirectory() as log_dir:
        entries = run_group(
            plan["variant"], plan["arch"], "bfloat16", tasks, contenders, plan, log_dir, echo
        )
    summarise(entries)
    devices = sorted({e["device"] for e in entries})
    if len(devices) > 1:
        echo(f"warning: the contenders ran on different devices: {devices}")
    peak = args.peak_tflops or published_peak_tflops(devices[0])
    if peak is None:
        echo(f"no published bfloat16 peak for {devices[0]!r}: MFU not computed (--peak-tflops)")
    add_utilisation(entries, peak)
    table = format_table(entries)
    print(table)
    result = dict(
        command="python bench/accelerator.py" + (" --smoke" if args.smoke else ""),
        started=started.isoformat(timespec="seconds"),
        minutes=(datetime.datetime.now(datetime.timezone.utc) - started).total_seconds() / 60,
        machine=machine(),
        devices=devices,
        peak_tflops=peak,
        plan={**plan, "contenders": contenders, "precision": "bfloat16"},
        entries=entries,
        table=table,
    )
    out = args.out or results_path("accelerator", device=entries[0]["device"])
    Path(out).write_text(json.dumps(result, indent=1))
    echo(f"wrote {out}")


if __name__ == "__main__":
    main()
