"""Times keras-vit steps with freed memory kept and with glibc's malloc left alone.

    python bench/allocator.py                   # PyTorch, Ti/16 at 224, batch 32 (4 minutes)
    python bench/allocator.py --backend jax --steps 5

`keras_vit.configure_for_backend()`, which the `keras-vit` command and the benchmarks'
Keras workers call, keeps freed memory under JAX and PyTorch
(`keras_vit.utils.allocator`); `KERAS_VIT_MALLOC=system` leaves malloc alone. For each
precision, task and setting, in that order, a fresh process builds the model through
`bench/contenders.py`'s Keras worker, runs two untimed steps, then times `--steps` steps
(its harness: `predict_on_batch` / `train_on_batch`, AdamW with global-norm clipping) and
counts its minor page faults. Rounds alternate the settings.
Writes `bench/results/allocator_CPU_DATE.json` (or `--out`): each step's seconds, the median, page faults
per step and the peak RSS.
"""

import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.models import machine, worker_environment, results_path  # noqa: E402

SETTINGS = ("system", "keep")
# One process's measurement, through the benchmark's own Keras worker; prints a JSON line.
STEPS = """
import json, resource, sys, time
from keras_vit.utils.allocator import configure_for_backend
configure_for_backend()  # under KERAS_VIT_MALLOC, as the `keras-vit` command does
from bench.contenders import KerasViT
from keras_vit.models.vit import parse_variant
precision, task, steps, variant, size, batch = sys.argv[1:]
runner = KerasViT(parse_variant(variant), int(size), int(batch), precision)
runner.prepare(task)
runner.step(); runner.step()
usage = lambda: resource.getrusage(resource.RUSAGE_SELF)
faults, seconds = usage().ru_minflt, []
for _ in range(int(steps)):
    start = time.perf_counter(); runner.step(); seconds.append(time.perf_counter() - start)
print(json.dumps(dict(seconds=seconds, faults_per_step=(usage().ru_minflt - faults) / len(seconds),
                      peak_rss_mib=usage().ru_maxrss / 1024)))
"""


def measure(backend, setting, precision, task, steps, variant, size, batch):
    """One fresh process's step times and page faults under `KERAS_VIT_MALLOC=setting`."""
    env = dict(worker_environment(), KERAS_BACKEND=backend, KERAS_VIT_MALLOC=setting)
    result = subprocess.run(
        [sys.executable, "-c", STEPS, precision, task, str(steps), variant, str(size), str(batch)],
        env=env, capture_output=True, text=True, check=False,
    )
    if result.returncode:
        raise SystemExit(f"{backend} {setting} {precision} {task} failed:\n{result.stderr[-3000:]}")
    row = json.loads(result.stdout.strip().splitlines()[-1])
    row["median_s"] = statistics.median(row["seconds"])
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="torch", choices=("torch", "jax"))
    parser.add_argument("--variant", default="Ti/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precisions", default="float32,bfloat16")
    parser.add_argument("--tasks", default="infer,train")
    parser.add_argument("--out", default=results_path("allocator"))
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = []
    for precision in args.precisions.split(","):
        for task in args.tasks.split(","):
            runs = {setting: [] for setting in SETTINGS}
            for _ in range(args.rounds):
                for setting in SETTINGS:
                    runs[setting].append(measure(args.backend, setting, precision, task,
                                                 args.steps, args.variant, args.image_size,
                                                 args.batch))
            medians = {s: statistics.median(r["median_s"] for r in runs[s]) for s in SETTINGS}
            row = dict(precision=precision, task=task, runs=runs, median_s=medians,
                       faults_per_step={s: statistics.median(r["faults_per_step"] for r in runs[s])
                                        for s in SETTINGS},
                       speedup_kept=medians["system"] / medians["keep"])
            rows.append(row)
            print(f"| {args.variant} | {precision} | {task} | {medians['system']:.3f} "
                  f"| {medians['keep']:.3f} | {row['speedup_kept']:.2f} "
                  f"| {row['faults_per_step']['system']:.0f} | {row['faults_per_step']['keep']:.0f} |",
                  flush=True)
    result = dict(
        command="python bench/allocator.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        started=started.isoformat(timespec="seconds"),
        machine=machine(),
        backend=args.backend,
        plan=dict(variant=args.variant, image_size=args.image_size, batch=args.batch,
                  steps=args.steps, rounds=args.rounds),
        rows=rows,
    )
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
