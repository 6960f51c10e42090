#!/usr/bin/env bash
# The checks of a machine with a GPU, in one go (docs/development.md):
#   1. bench/accelerator.py: ViT-B/16 in bfloat16 against HF, on each installed backend;
#   2. the GPU test subset (tests marked `gpu`) once per installed Keras backend;
#   3. beside them, bench/digits_fit.py in mixed_bfloat16 on each backend: a training run
#      through Keras' `fit` whose loss must fall.
# Every part has its own time limit, so one that hangs leaves the others their time.
#
#   bash bench/gpu_checks.sh OUT_DIR [accelerator.py arguments, e.g. --smoke]
#
# OUT_DIR gets env.txt (the card, the driver, the packages), bench.log and
# accelerator.json, tests_BACKEND.log for each backend, and digits.log. Where JAX's tests
# fail, they run once more at float32 matmul precision "highest" (tests_jax_highest.log):
# on GPUs JAX's default float32 product may round its inputs to TF32.
set -u
out=${1:?usage: bash bench/gpu_checks.sh OUT_DIR [accelerator.py arguments]}
shift
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
python=${PYTHON:-python3}

{ nvidia-smi || echo "no nvidia-smi"; } > "$out/env.txt" 2>&1
backends=$("$python" - 2>>"$out/env.txt" <<'EOF'
import importlib, importlib.metadata, platform, sys
print("python", platform.python_version(), platform.machine(), file=sys.stderr)
for name in ("keras", "transformers"):
    try:
        print(name, importlib.metadata.version(name), file=sys.stderr)
    except importlib.metadata.PackageNotFoundError:
        print(name, "not installed", file=sys.stderr)
found = []
for name in ("tensorflow", "jax", "torch"):
    try:
        print(name, importlib.import_module(name).__version__, file=sys.stderr)
        found.append(name)
    except Exception as error:
        print(name, "not importable:", error, file=sys.stderr)
print(" ".join(found))
EOF
)
echo "backends: $backends" >> "$out/env.txt"

contenders=$(for b in $backends; do printf 'keras-%s,' "$b"; done)hf-torch
timeout 240 "$python" bench/accelerator.py --contenders "$contenders" \
    --out "$out/accelerator.json" "$@" > "$out/bench.log" 2>&1
echo "accelerator.py exit $?" >> "$out/bench.log"

files=$(grep -l "^pytestmark = pytest.mark.gpu" tests/test_*.py)
workers=$(( $(nproc) > 12 ? 6 : 0 ))  # per backend (the two run side by side); 0: in-process
for b in $backends; do
    KERAS_BACKEND=$b timeout 180 "$python" -m pytest -rfs -n $workers --dist loadfile \
        -m "gpu and not slow" -W ignore::UserWarning $files > "$out/tests_$b.log" 2>&1 &
done
for b in $backends; do  # sharing the GPU with the tests: JAX takes memory as it needs it
    echo "== $b"
    XLA_PYTHON_CLIENT_PREALLOCATE=false KERAS_BACKEND=$b timeout 150 \
        "$python" bench/digits_fit.py --dtype-policy mixed_bfloat16 2>&1 | tail -n 2
    echo "exit ${PIPESTATUS[0]}"
done > "$out/digits.log" 2>&1 &
wait
if grep -q "^FAILED" "$out/tests_jax.log" 2>/dev/null; then
    failed=$(grep "^FAILED" "$out/tests_jax.log" | sed 's/^FAILED \([^ ]*\).*/\1/')
    JAX_DEFAULT_MATMUL_PRECISION=highest KERAS_BACKEND=jax timeout 60 "$python" -m pytest \
        -q -rfs -n 4 -W ignore::UserWarning $failed > "$out/tests_jax_highest.log" 2>&1
fi
cat "$out/digits.log"
for log in "$out"/tests_*.log; do echo "$log: $(tail -n 1 "$log")"; done
