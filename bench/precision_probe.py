"""Which frameworks compute bfloat16 matrix products faster than float32 on this CPU?

    python bench/precision_probe.py    # about a minute

Times one 2048^3 product (`bench/contenders.matmul_gflops`) per framework in float32 and
bfloat16, each in its own process: TensorFlow under XLA (how keras-vit's models run on
TensorFlow) and without it (TensorFlow's own oneDNN kernels), JAX (XLA), PyTorch (eager).
On a CPU with AMX or AVX-512 BF16 a path that reaches those units runs bfloat16 several
times faster than float32; one that does not runs it at float32's speed or slower. Prints
the CPU's reduced-precision flags and a table, and writes `bench/precision_probe.json`.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.models import machine  # noqa: E402

PATHS = ("tensorflow-xla", "tensorflow-graph", "jax", "torch")
WORKER = """
import json, sys
sys.path.insert(0, {root!r})
from bench.contenders import matmul_gflops
path, precision = sys.argv[1], sys.argv[2]
if path == "tensorflow-graph":
    import numpy as np, tensorflow as tf
    from bench.contenders import MATMUL_SIZE, best_gflops
    a = tf.cast(tf.constant(np.random.default_rng(1).uniform(
        size=(MATMUL_SIZE, MATMUL_SIZE)).astype("float32")), precision)
    matmul = tf.function(lambda: tf.matmul(a, a), jit_compile=False, autograph=False)
    print(json.dumps(best_gflops(lambda: matmul().numpy())))
else:
    print(json.dumps(matmul_gflops(path.split("-")[0], precision)))
"""


def main():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    script = WORKER.format(root=str(ROOT))
    rows = []
    for path in PATHS:
        rates = {}
        for precision in ("float32", "bfloat16"):
            out = subprocess.run(
                [sys.executable, "-c", script, path, precision],
                capture_output=True, text=True, env=env, check=True,
            ).stdout
            rates[precision] = json.loads(out.strip().splitlines()[-1])
        rows.append(dict(path=path, gflops=rates, bf16_speedup=rates["bfloat16"] / rates["float32"]))
    info = machine()
    print(f"{info['cpu']}; flags: {', '.join(info['cpu_flags'])}")
    print("| path | float32 GFLOP/s | bfloat16 GFLOP/s | bfloat16 / float32 |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['path']} | {r['gflops']['float32']:.0f} | {r['gflops']['bfloat16']:.0f} "
              f"| {r['bf16_speedup']:.2f} |")
    result = dict(command="python bench/precision_probe.py", machine=info,
                  load_average=os.getloadavg(), rows=rows)
    (ROOT / "bench" / "precision_probe.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
