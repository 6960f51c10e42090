"""Where a bfloat16 step's time goes on PyTorch: keras-vit against HF, under torch.profiler.

    python bench/gpu_profile.py [--variant B/16] [--batch 128]
    python bench/gpu_profile.py --smoke    # a tiny model: keeps the script working

For keras-vit on PyTorch and HF transformers' ViT (bench/contenders.py, the same
models, data and steps as bench/accelerator.py), each warmed up, then `--steps` steps
of inference and of training profiled: per step the wall time, the CPU time spent inside
PyTorch's operators (the rest of the wall time, less any wait for the GPU, is Python),
the device time and the number of kernels (on a GPU; operators on a CPU), and the
`--top` kernels with the most device time. A step whose wall time is far above its
device time is bound by Python and dispatch, not by the GPU. Prints a table; `--out`
writes the full report as JSON.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ["KERAS_BACKEND"] = "torch"  # the contenders profiled are PyTorch ones
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.contenders import HFViT, KerasViT, device_name  # noqa: E402
from bench.models import TINY  # noqa: E402


def profile_steps(contender, mode, steps, top):
    """Profiles `steps` steps of `contender` in `mode`; returns their per-step figures."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    contender.prepare(mode)
    for _ in range(3):
        contender.step()
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            contender.step()
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    # Device kernels on a GPU; on a CPU the top-level operators stand in for them.
    kernels = [e for e in events if e.device_type.name == "CUDA"] if cuda else [
        e for e in events if e.key.startswith("aten::")
    ]
    device_us = lambda e: e.self_device_time_total if cuda else e.self_cpu_time_total
    kernels.sort(key=device_us, reverse=True)
    return {
        "wall_ms": 1e3 * wall / steps,
        "in_ops_ms": sum(e.self_cpu_time_total for e in events) / 1e3 / steps,
        "device_ms": sum(device_us(e) for e in kernels) / 1e3 / steps,
        "kernels": sum(e.count for e in kernels) / steps,
        "top": [
            {"name": e.key[:90], "ms": device_us(e) / 1e3 / steps, "calls": e.count / steps}
            for e in kernels[:top]
        ],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--smoke", action="store_true", help="a tiny model, few steps")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from keras_vit import parse_variant

    if args.smoke:
        arch, args.image_size, args.batch, args.steps = TINY, 32, 4, 2
    else:
        arch = parse_variant(args.variant)
    report = {"device": device_name("torch"), "variant": "tiny" if args.smoke else args.variant,
              "image_size": args.image_size, "batch": args.batch, "rows": []}
    for name, cls in (("keras-torch", KerasViT), ("hf-torch", HFViT)):
        contender = cls(arch, args.image_size, args.batch, "bfloat16")
        for mode in ("infer", "train"):
            row = {"contender": name, "mode": mode,
                   **profile_steps(contender, mode, args.steps, args.top)}
            report["rows"].append(row)
            print(f"{name:12} {mode:5} wall {row['wall_ms']:8.2f} ms  in ops {row['in_ops_ms']:8.2f}"
                  f" ms  device {row['device_ms']:8.2f} ms  kernels {row['kernels']:7.0f}")
            for kernel in row["top"]:
                print(f"    {kernel['ms']:8.3f} ms {kernel['calls']:6.0f}x  {kernel['name']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
