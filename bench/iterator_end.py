"""What tf.data's autotuning adds when a Keras call ends, and what `without_autotuning` saves.

    python bench/iterator_end.py              # about 3 minutes on 2 cores
    python bench/iterator_end.py --passes 30  # longer calls

Destroying the iterator of an autotuned `tf.data` dataset waits for the next wake-up of
its optimisation thread, whose sleep doubles from 10 ms to 60 s. This times, on the
TensorFlow backend, `predict`, `evaluate` and `fit` of a small ViT on keras-vit's own
pipelines over the built-in digits (`eval_dataset` repeated `--passes` times, and
`train_dataset` for as many steps), each as the pipelines build it (`without_autotuning`)
and with autotuning switched back on, alternating, `--rounds` times. For each call it
records the seconds from the call to its return (`total`) and from the end callback
(`on_predict_end`, `on_test_end`, `on_train_end`) to the return (`after_end`): the
iterator's destruction. Writes `bench/iterator_end.json`.
"""

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_vit  # noqa: E402
from bench.models import machine  # noqa: E402
from keras_vit import data  # noqa: E402

IMAGE_SIZE = 64
BATCH = 32


class EndTime(keras.callbacks.Callback):
    """Remembers when the last end callback of a call ran."""

    def on_predict_end(self, logs=None):
        self.time = time.perf_counter()

    on_test_end = on_train_end = on_predict_end


def autotuned(dataset):
    options = tf.data.Options()
    options.autotune.enabled = True
    return dataset.with_options(options)


def timed_call(model, call, pipelines, passes):
    """`{"total", "after_end"}` seconds of one `call` over `pipelines` (eval, train, eval
    batches a pass)."""
    evaluation, training, batches = pipelines
    end = EndTime()
    start = time.perf_counter()
    if call == "fit":
        model.fit(training, epochs=1, steps_per_epoch=passes * batches, shuffle=False, callbacks=[end], verbose=0)
    else:
        getattr(model, call)(evaluation.repeat(passes), callbacks=[end], verbose=0)
    done = time.perf_counter()
    return {"total": done - start, "after_end": done - end.time}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passes", type=int, default=12, help="passes over the 360 digits")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "bench" / "iterator_end.json"))
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc)
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(
        image_size=IMAGE_SIZE, patch_size=4, hidden_dim=64, num_layers=4, num_heads=2,
        mlp_dim=128, num_classes=10, channels=1,
    )
    model.compile(optimizer="adam", loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    digits = data.load_source("digits", "test")
    built = (
        data.eval_dataset(digits, IMAGE_SIZE, BATCH, channels=1, crop_fraction=1),
        data.train_dataset(digits, IMAGE_SIZE, BATCH, channels=1),
    )
    batches = -(-digits.size // BATCH)
    variants = {
        "without_autotuning": (*built, batches),
        "autotuned": (*map(autotuned, built), batches),
    }
    for call in ("predict", "evaluate", "fit"):  # compile each step function once
        timed_call(model, call, variants["without_autotuning"], 1)
    rows = {name: {call: [] for call in ("predict", "evaluate", "fit")} for name in variants}
    for _ in range(args.rounds):
        for call in ("predict", "evaluate", "fit"):
            for name, pipelines in variants.items():
                rows[name][call].append(timed_call(model, call, pipelines, args.passes))
    result = {
        "command": "python bench/iterator_end.py " + " ".join(
            argv if argv is not None else sys.argv[1:]
        ),
        "started": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "passes": args.passes,
        "calls": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for name, calls in rows.items():
        for call, timings in calls.items():
            cells = "  ".join(
                f"{t['total']:6.2f} s ({t['after_end']:5.2f} s after the end)" for t in timings
            )
            print(f"{name:18s} {call:8s} {cells}")


if __name__ == "__main__":
    main()
