"""How much faster is keras-vit under `mixed_bfloat16` than in float32, on this CPU?

    python bench/precision_speedup.py    # about 5 minutes on 2 cores

For TensorFlow and JAX (each in its own process, Keras picks its backend once), builds
ViT-Ti/16 at 224 px twice with the same weights, in float32 and under Keras'
`mixed_bfloat16` policy, compiles both (XLA), and times them in turn, inference and a
training step at batch 32. Times are CPU seconds per step (all threads), the best of
the rounds: on a shared machine they are steadier than wall time, and on an idle one
they are the wall time times the cores used. Also reports how often the two models'
top-1 predictions agree. Writes `bench/results/precision_speedup_CPU_DATE.json`.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.models import machine, results_path  # noqa: E402

BACKENDS = ("tensorflow", "jax")
ROUNDS = 3
WORKER = """
import json, sys, time
import numpy as np
import keras
sys.path.insert(0, {root!r})
import keras_vit
from keras_vit.models.vit import parse_variant
keras_vit.configure_for_backend()

arch = parse_variant("Ti/16")
arch.pop("resnet_stages")
rng = np.random.default_rng(0)
images = rng.uniform(-1, 1, (32, 224, 224, 3)).astype("float32")
labels = rng.integers(0, 1000, 32)
models = {{}}
for policy in ("float32", "mixed_bfloat16"):
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(image_size=224, num_classes=1000, **arch)
    if policy == "float32":
        head = model.parts.head.kernel
        head.assign(rng.normal(0, 0.02, head.shape))  # a zero head predicts nothing
        weights = model.get_weights()
    else:
        model.set_weights(weights)
    model.compile(optimizer="adamw",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    models[policy] = model
keras.config.set_dtype_policy("float32")
predictions = {{p: np.asarray(m.predict_on_batch(images), "float32") for p, m in models.items()}}
agreement = float(np.mean(predictions["float32"].argmax(1) == predictions["mixed_bfloat16"].argmax(1)))
steps = {{"infer": lambda m: m.predict_on_batch(images),
          "train": lambda m: m.train_on_batch(images, labels)}}
seconds = {{}}
for mode, step in steps.items():
    for model in models.values():
        step(model), step(model)
    rounds = {{p: [] for p in models}}
    for _ in range({rounds}):
        for policy, model in models.items():
            start = time.process_time()
            step(model)
            rounds[policy].append(time.process_time() - start)
    seconds[mode] = {{p: min(r) for p, r in rounds.items()}}
print(json.dumps(dict(cpu_seconds_per_step=seconds, top1_agreement=agreement)))
"""


def main():
    rows = {}
    for backend in BACKENDS:
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
        out = subprocess.run(
            [sys.executable, "-c", WORKER.format(root=str(ROOT), rounds=ROUNDS)],
            capture_output=True, text=True, env=env, check=True,
        ).stdout
        rows[backend] = json.loads(out.strip().splitlines()[-1])
    info = machine()
    print(f"{info['cpu']}; flags: {', '.join(info['cpu_flags'])}")
    print("| backend | task | float32 CPU s/step | bfloat16 CPU s/step | bfloat16 speed-up |")
    print("|---|---|---|---|---|")
    for backend, row in rows.items():
        for mode, seconds in row["cpu_seconds_per_step"].items():
            row.setdefault("speedup", {})[mode] = seconds["float32"] / seconds["mixed_bfloat16"]
            print(f"| {backend} | {mode} | {seconds['float32']:.2f} | "
                  f"{seconds['mixed_bfloat16']:.2f} | {row['speedup'][mode]:.2f} |")
        print(f"| {backend} | top-1 agreement | {row['top1_agreement']:.3f} | | |")
    result = dict(command="python bench/precision_speedup.py", machine=info,
                  load_average=os.getloadavg(), rounds=ROUNDS, rows=rows)
    Path(results_path("precision_speedup")).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
