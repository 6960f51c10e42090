"""Times Keras' `predict` and `predict_on_batch` back to back and after a pause.

    python bench/pause.py                      # TensorFlow, Ti/16 at 224, batch 32 (2 minutes)
    KERAS_BACKEND=jax python bench/pause.py --pause 3 --rounds 4

In `bench/models.py` each worker waits while the others are timed; there TensorFlow's
`predict` rows fall further below its `predict_on_batch` rows than in a process that
calls them back to back. This bench measures that wait alone: one process builds the
model through `bench/contenders.py`'s Keras worker and, each round, times one `predict`
of `--batches` batches on a fresh numpy array (the worker's `keras-api` call), one
`predict` of the same on the pipeline made from one tensor of the whole array
(`array_batches(..., shardable=True)`, what a model under a `tf.distribute` strategy
reads arrays as, and every model did before arrays were sliced a batch at a time:
`whole-tensor`) and the same number of `predict_on_batch` calls (its harness), first
back to back, then each after sleeping `--pause` seconds. Writes `bench/pause.json` (or
`--out`): every call's seconds, the medians and their ratios to `predict_on_batch`, the
page faults of each call.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from bench.contenders import KerasViT, page_faults, repeated, timed, timed_round  # noqa: E402
from bench.models import machine  # noqa: E402
from keras_vit.data import array_batches  # noqa: E402
from keras_vit.models.vit import parse_variant  # noqa: E402

CALLS = ("keras-api", "whole-tensor", "harness")


def whole_tensor_call(runner, batches):
    """A `predict` (its array made, not yet run) of `batches` batches of a fresh array
    through the pipeline made from one tensor of the whole array, which the call makes."""
    images = repeated(runner.numpy_images, batches)
    return lambda: runner.model.predict(
        array_batches(images, runner.batch, shardable=True), verbose=0
    )


def timed_call(runner, call, batches, pause):
    """Seconds and minor page faults of one `call` (a `CALLS` name) of `batches`
    batches, after sleeping `pause` seconds."""
    time.sleep(pause)
    run = whole_tensor_call(runner, batches) if call == "whole-tensor" else None
    _, faults = page_faults()
    seconds = timed(run) if run else sum(timed_round(runner, call, batches))
    return seconds, page_faults()[1] - faults


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="Ti/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--precision", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--pause", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", default=str(ROOT / "bench" / "pause.json"))
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc)
    runner = KerasViT(parse_variant(args.variant), args.image_size, args.batch, args.precision)
    runner.prepare("infer")
    for call in CALLS:
        for _ in range(2):
            timed_call(runner, call, args.batches, 0)
    calls = {(pause, c): [] for pause in (0.0, args.pause) for c in CALLS}
    for _ in range(args.rounds):
        for pause, call in calls:
            calls[(pause, call)].append(timed_call(runner, call, args.batches, pause))
    rows = []
    for pause in (0.0, args.pause):
        medians = {c: statistics.median(s for s, _ in calls[(pause, c)]) for c in CALLS}
        rows.append(dict(
            pause_s=pause,
            seconds={c: [s for s, _ in calls[(pause, c)]] for c in CALLS},
            minor_faults={c: [f for _, f in calls[(pause, c)]] for c in CALLS},
            median_s=medians,
            over_predict_on_batch={c: medians[c] / medians["harness"] for c in CALLS[:2]},
        ))
        ratios = rows[-1]["over_predict_on_batch"]
        print(f"pause {pause:.0f} s: {args.batches} x predict_on_batch {medians['harness']:.3f} s, "
              f"predict {medians['keras-api']:.3f} s ({ratios['keras-api']:.2f}x), "
              f"predict on one whole tensor {medians['whole-tensor']:.3f} s "
              f"({ratios['whole-tensor']:.2f}x)", flush=True)
    result = dict(
        command="python bench/pause.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        started=started.isoformat(timespec="seconds"),
        machine=machine(),
        backend=os.environ["KERAS_BACKEND"],
        plan=dict(variant=args.variant, image_size=args.image_size, batch=args.batch,
                  precision=args.precision,
                  batches=args.batches, pause_s=args.pause, rounds=args.rounds),
        rows=rows,
    )
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
