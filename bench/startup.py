"""How soon the `keras-vit` command answers a user's mistake, and lists the registry.

Each command runs `--runs` times in a fresh process (`python -m keras_vit`, this
checkout's code), and the median wall time is recorded, beside that of `import keras`
alone (what every command paid first before the checks came ahead of the backend's
start). The commands: `keras-vit weights`; `predict` and `finetune` with a `--from`
folder that does not exist; `predict` of an image that does not exist; `visualize` of
a missing image; `--help`. Writes `bench/results/startup_MACHINE_DATE.json` (`--out`)
with the CPU model.

    python bench/startup.py [--runs 5]    # about a minute on 2 cores
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.models import machine, results_path  # noqa: E402


def timed(command, env):
    """Seconds `command` takes in a fresh process, and its exit code."""
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, result.returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=results_path("startup"))
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERAS_BACKEND": "tensorflow"}
    cli = [sys.executable, "-m", "keras_vit"]
    with tempfile.TemporaryDirectory() as folder:
        model = os.path.join(folder, "model.keras")
        subprocess.run(
            [sys.executable, "-c", "import keras_vit, sys; keras_vit.ViT(image_size=32, "
             "patch_size=8, hidden_dim=32, num_layers=1, num_heads=4, mlp_dim=64, "
             "num_classes=10).save(sys.argv[1])", model],
            env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"}, check=True, capture_output=True,
        )
        missing_run = os.path.join(folder, "runs", "no_such_run")
        missing_image = os.path.join(folder, "photo.jpg")
        commands = {
            "weights": cli + ["weights"],
            "predict, missing --from": cli + ["predict", "--from", missing_run, model],
            "finetune, missing --from": cli + ["finetune", "--from", missing_run],
            "predict, missing image": cli + ["predict", "--from", model, missing_image],
            "visualize, missing image": cli + ["visualize", "--from", model, "--image",
                                               missing_image, "--out", folder],
            "--help": cli + ["--help"],
            "import keras (for comparison)": [sys.executable, "-c", "import keras"],
        }
        results = {}
        for name, command in commands.items():
            runs = [timed(command, env) for _ in range(args.runs)]
            codes = sorted({code for _, code in runs})
            results[name] = dict(
                median_s=round(statistics.median(s for s, _ in runs), 3),
                runs_s=[round(s, 3) for s, _ in runs],
                exit_codes=codes,
            )
            print(f"{name:32s} {results[name]['median_s']:6.2f} s  (exit {codes})")
    record = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        machine=machine(),
        runs=args.runs,
        commands={name: " ".join(["keras-vit", *command[3:]] if command[:3] == cli else command[1:])
                  for name, command in commands.items()},
        results=results,
    )
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
