"""The benchmarks keep working (each script's smoke run, on the CPU) and bench/results/ holds
what bench/README.md says it does."""

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A result file's name: SCRIPT_MACHINE_DATE, then an optional _suffix (bench/README.md).
RESULT_NAME = re.compile(r"([a-z_]+?)_([a-z0-9-]+)_(\d{4}-\d{2}-\d{2}(?:T\d{4})?)(?:_\w+)?\.(?:json|log)")


def run_bench(script, *args):
    """Runs `bench/SCRIPT` with `args` from the checkout; returns its stdout (its exit
    status must be 0)."""
    result = subprocess.run(
        [sys.executable, f"bench/{script}", *args],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert result.returncode == 0, result.stderr[-5000:]
    return result.stdout


@pytest.mark.slow
def test_gpu_checks_run_the_bench_and_the_test_subset_per_backend_without_tensorflow(tmp_path):
    """`bench/gpu_checks.sh` as on the lent GPU machines, whose image has JAX and PyTorch
    but no TensorFlow (made unimportable here): the accelerator benchmark times each
    contender and computes its MFU from the FLOPs `keras_vit.forward_flops` counts; the
    `gpu` test subset and the digits training run on JAX and PyTorch, and the subset's
    tests pass without TensorFlow (among them `load_pretrained` from a saved model, which
    once imported it)."""
    shim = tmp_path / "no_tensorflow" / "tensorflow"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'tensorflow'\", name='tensorflow')\n")
    out = tmp_path / "out"
    env = {
        **os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(shim.parent),
        # Two tests of the subset (seven with their parameters), not all of it.
        "PYTEST_ADDOPTS": "-p no:cacheprovider "
                          "-k 'patches_order or equals_a_model_loaded_at_that_size'",
    }
    result = subprocess.run(
        ["bash", "bench/gpu_checks.sh", str(out), "--smoke", "--peak-tflops", "0.5"],
        cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "backends: jax torch" in (out / "env.txt").read_text()
    report = json.loads((out / "accelerator.json").read_text())
    rows = {(e["contender"], e["mode"]): e for e in report["entries"]}
    assert set(rows) == {
        (c, m) for c in ("keras-jax", "keras-torch", "hf-torch") for m in ("infer", "train")
    }
    import keras

    import keras_vit

    with keras.StatelessScope():
        flops = keras_vit.forward_flops(keras_vit.ViT(
            image_size=32, patch_size=8, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=64,
            num_classes=1000))
    for (contender, mode), e in rows.items():
        assert e["precision"] == "bfloat16" and e["device"] == "cpu"
        factor = 3 if mode == "train" else 1  # forward + backward: 3x the forward FLOPs
        assert e["flops_per_image"] == flops * factor
        assert e["mfu"] == pytest.approx(e["median_images_per_s"] * flops * factor / 0.5e12)
        assert e["median_images_per_s"] > 0
    assert "| tiny | hf-torch | cpu | train |" in (out / "bench.log").read_text()
    for backend in ("jax", "torch"):
        log = (out / f"tests_{backend}.log").read_text()
        assert f"backend {backend} on cpu" in log
        summary = log.strip().splitlines()[-1]
        assert " 7 passed" in summary and "failed" not in summary, log[-3000:]
    # bench/digits_fit.py beside the tests: per backend its JSON line and exit status.
    digits = (out / "digits.log").read_text()
    for backend in ("jax", "torch"):
        lines = digits.split(f"== {backend}\n")[1].split("== ")[0].splitlines()
        result = json.loads(next(line for line in lines if line.startswith("{")))
        assert (result["backend"], result["dtype_policy"]) == (backend, "mixed_bfloat16")
        assert result["losses"][-1] < result["losses"][0] and "exit 0" in lines, digits


@pytest.mark.slow
def test_gpu_profile_reports_each_contenders_steps_and_top_kernels(tmp_path):
    out = tmp_path / "gpu_profile.json"
    stdout = run_bench("gpu_profile.py", "--smoke", "--top", "3", "--out", str(out))
    report = json.loads(out.read_text())
    rows = {(row["contender"], row["mode"]): row for row in report["rows"]}
    assert set(rows) == {(c, m) for c in ("keras-torch", "hf-torch") for m in ("infer", "train")}
    for (contender, mode), row in rows.items():
        assert row["wall_ms"] > 0 and row["in_ops_ms"] > 0 and row["kernels"] > 0
        top = [kernel["ms"] for kernel in row["top"]]
        assert len(top) == 3 and top == sorted(top, reverse=True)
        assert f"{contender:12} {mode:5} wall" in stdout


@pytest.mark.slow
def test_allocator_benchmark_times_each_setting_in_its_own_process(tmp_path):
    out = tmp_path / "allocator.json"
    stdout = run_bench("allocator.py", "--image-size", "32", "--batch", "2", "--steps", "2",
                       "--rounds", "1", "--precisions", "float32", "--out", str(out))
    (infer, train) = json.loads(out.read_text())["rows"]
    assert (infer["task"], train["task"]) == ("infer", "train")
    for row in (infer, train):
        for setting in ("system", "keep"):
            (run,) = row["runs"][setting]
            assert len(run["seconds"]) == 2 and run["peak_rss_mib"] > 0
            assert row["median_s"][setting] == pytest.approx(sum(run["seconds"]) / 2)
        assert row["speedup_kept"] == row["median_s"]["system"] / row["median_s"]["keep"]
    assert "| Ti/16 | float32 | train |" in stdout


@pytest.mark.slow
def test_memory_benchmark_separates_fixed_and_per_image_memory(tmp_path):
    out = tmp_path / "memory.json"
    stdout = run_bench("memory.py", "--variant", "Ti/16", "--image-size", "32",
                       "--contenders", "keras-jax,hf-torch", "--out", str(out))
    report = json.loads(out.read_text())
    assert [r["contender"] for r in report["rows"]] == ["keras-jax", "hf-torch"]
    for row in report["rows"]:
        small, large = row["peaks_mib"]["2"], row["peaks_mib"]["32"]
        for peaks in (small, large):  # high-water marks only grow
            assert 0 < peaks["build"] <= peaks["infer"] <= peaks["train"]
        assert row["train_per_image_mib"] == (large["train"] - small["train"]) / 30
        assert f"| {row['contender']} |" in stdout


@pytest.mark.slow
def test_predict_benchmark_times_keras_vit_and_hfs_pipeline_on_the_same_files(tmp_path):
    out = tmp_path / "predict.json"
    stdout = run_bench("predict.py", "--images", "12", "--batch", "4", "--precisions", "float32",
                       "--contenders", "keras-tensorflow,hf-pipeline", "--out", str(out))
    rows = {(row["contender"], row["precision"]): row
            for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {("keras-tensorflow", "float32"), ("hf-pipeline", "float32")}
    keras_row, hf_row = rows["keras-tensorflow", "float32"], rows["hf-pipeline", "float32"]
    assert hf_row["x_hf_pipeline"] == 1.0 and hf_row["top1_agreement_hf_pipeline"] == 1.0
    assert keras_row["x_hf_pipeline"] == pytest.approx(
        keras_row["images_per_s"] / hf_row["images_per_s"], rel=0.02)
    assert keras_row["x_hf_pipeline_same_precision"] == keras_row["x_hf_pipeline"]
    # The same weights and [-1, 1] scaling: only the resize filters differ (PIL antialiases).
    assert keras_row["top1_agreement_hf_pipeline"] >= 0.75
    assert keras_row["startup_s"] > 0 and "| keras-tensorflow |" in stdout


@pytest.mark.slow
def test_naflex_benchmark_counts_the_real_tokens_of_each_mode(tmp_path):
    """The NaFlex benchmark on one backend: every mode timed for inference and training,
    its tokens per second the real tokens of its batch over its step time, the fixed
    mode's ratio 1, the padded batch one image per row and the packed one more images
    than rows."""
    out = tmp_path / "naflex.json"
    stdout = run_bench("naflex.py", "--budget", "16", "--batch", "2", "--num-layers", "1",
                       "--rounds", "1", "--steps", "1", "--images-per-row", "3",
                       "--contenders", "keras-tensorflow", "--out", str(out))
    report = json.loads(out.read_text())
    batches, results = report["batches"], report["results"]["keras-tensorflow"]
    assert set(results) == {f"{t}/{m}" for t in ("infer", "train")
                            for m in ("fixed", "padded", "packed")}
    assert batches["fixed"] == {"images": 2, "tokens": 32}
    assert batches["padded"]["images"] == 2 and 2 <= batches["padded"]["tokens"] <= 32
    assert 2 < batches["packed"]["images"] <= 6 and batches["packed"]["tokens"] <= 32
    for key, row in results.items():
        assert row["tokens_per_s"] * row["step_s"] == pytest.approx(
            batches[key.split("/")[1]]["tokens"], rel=1e-6)
        assert row["x_fixed"] == 1.0 if key.endswith("/fixed") else row["x_fixed"] > 0
    assert "| keras-tensorflow | train | packed |" in stdout


@pytest.mark.slow
def test_models_benchmark_times_keras_predict_and_fit_beside_the_harness(tmp_path):
    """Every contender, task and interface for the tiny ViT; the tiny DINOv2 and SigLIP
    rows (HF's Dinov2Model and SiglipVisionModel with a linear head) through the harness
    against keras-vit on PyTorch (their Keras-API path is the ViT's), each row in two
    sets of worker processes (`--processes 2`) and asked for in bfloat16 too, which the
    plan has no rows of; `fit` on NumPy arrays on TensorFlow (`--fit-on arrays`)."""
    rows, stdout, plans = {}, "", {}
    runs = {
        "vit": ("--models", "tiny", "--keras-api"),
        "families": ("--models", "tiny-dinov2,tiny-siglip", "--contenders", "keras-torch,hf-torch",
                     "--processes", "2", "--precisions", "float32,bfloat16"),
        "arrays": ("--models", "tiny", "--keras-api", "--fit-on", "arrays", "--precisions",
                   "float32", "--contenders", "keras-tensorflow"),
    }
    for name, arguments in runs.items():
        out = tmp_path / f"{name}.json"
        stdout += run_bench("models.py", "--smoke", *arguments, "--out", str(out))
        result = json.loads(out.read_text())
        plans[name] = result["plan"]
        entries = result["entries"]
        if name == "arrays":
            assert {(e["contender"], e["mode"], e["interface"]) for e in entries} == {
                ("keras-tensorflow", m, i) for m in ("infer", "train")
                for i in ("keras-api", "harness")}
            continue
        rows.update({(e["variant"], e["contender"], e["mode"], e["interface"]): e
                     for e in entries})
    # A model and precision asked for by name that the plan lacks is said, the rest run.
    assert ("The plan has no rows of tiny-dinov2 in bfloat16, tiny-siglip in bfloat16: "
            "running the others.") in stdout
    assert [plans[name]["fit_on"] for name in runs] == ["tf.data", "tf.data", "arrays"]
    assert [plans[name]["processes"] for name in runs] == [1, 2, 1]
    assert set(rows) == {
        ("tiny", c, m, i)
        for c in ("keras-tensorflow", "keras-jax", "keras-torch", "hf-torch")
        for m in ("infer", "train") for i in ("keras-api", "harness")
    } | {
        (v, c, m, "harness") for v in ("tiny-dinov2", "tiny-siglip")
        for c in ("keras-torch", "hf-torch") for m in ("infer", "train")
    }
    for (variant, contender, mode, interface), e in rows.items():
        assert e["median_images_per_s"] > 0
        # Each timed round counts the page faults of its worker.
        assert len(e["major_faults"]) == len(e["minor_faults"]) == len(e["images_per_s"])
        assert all(isinstance(n, int) and n >= 0 for n in e["major_faults"] + e["minor_faults"])
        if contender != "hf-torch":  # against HF through the same interface, same rounds
            hf = rows[(variant, "hf-torch", mode, interface)]
            assert e["ratio_vs_hf"] == pytest.approx(statistics.median(
                a / b for a, b in zip(e["images_per_s"], hf["images_per_s"])))
        # A round a process: the smoke plan's one round in each of the run's processes.
        assert e["process"] == ([0, 1] if variant.startswith("tiny-") else [0])
    # The table gives each process's median where a row ran in several.
    assert "img/s per process |" in stdout
    # A model of the plan timed at its own batch says so in the table.
    assert {e["batch"] for (v, *_), e in rows.items() if v == "tiny-siglip"} == {2}
    assert "| tiny-siglip (batch 2) |" in stdout
    # The Keras-API rows come first in the table.
    assert stdout.index("| keras-api |") < stdout.index("| harness |")
    # The families' FLOPs count their own parts: SigLIP's MAP head beside the ViT's.
    flops = {v: rows[(v, "hf-torch", "infer", "harness")]["flops_per_image"]
             for v in ("tiny", "tiny-siglip")}
    assert flops["tiny-siglip"] != flops["tiny"]


def test_models_benchmark_selects_rows_by_model_and_names_an_unknown_one():
    result = subprocess.run(
        [sys.executable, "bench/models.py", "--smoke", "--models", "tiny-dinov2,vit-x"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 2
    assert ("unknown models ['vit-x']: expected some of tiny, tiny-dinov2, tiny-siglip"
            in result.stderr)
    # --overhead's plan is Ti/16 alone.
    result = subprocess.run(
        [sys.executable, "bench/models.py", "--overhead", "--models", "S/16"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 2 and "unknown models ['S/16']: expected some of Ti/16" in result.stderr


def test_a_killed_benchmark_worker_is_named_with_the_likely_cause(monkeypatch, tmp_path):
    """A worker process killed by SIGKILL (what the out-of-memory killer sends, when four
    workers of a large model outgrow the machine's memory) is named, with what to do."""
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.delitem(sys.modules, "bench.models", raising=False)
    from bench.models import Worker

    worker = Worker("hf-torch", tmp_path)
    worker.send(op="round", steps=1, interface="harness")
    worker.process.kill()  # while it works on the request, as the kernel's killer does
    with pytest.raises(RuntimeError, match=(
        r"benchmark worker hf-torch exited with code -9 \(SIGKILL: on Linux most likely the "
        r"out-of-memory killer; time fewer contenders at once with --contenders")):
        worker.receive()


@pytest.mark.slow
def test_remat_keeps_fewer_residuals_and_the_same_gradients(tmp_path):
    """`ViT(remat=True)` on JAX: the arrays kept for the backward pass shrink (each block
    keeps only its input), and the gradients equal those without remat to float32 rounding."""
    out = tmp_path / "remat.json"
    stdout = run_bench("remat.py", "--variant", "Ti/16", "--image-size", "32", "--batch", "2",
                       "--out", str(out))
    report = json.loads(out.read_text())
    assert report["remat"]["residual_bytes"] < report["without"]["residual_bytes"] / 10
    assert report["gradient_max_difference"] <= 1e-6 * report["gradient_max_abs"]
    assert "gradients: max difference" in stdout


def test_the_bench_map_lists_every_script_and_result_and_nothing_else():
    """bench/README.md names every script of bench/ and every file of bench/results/, and
    every result it names exists; result files are named SCRIPT_MACHINE_DATE after a
    script that is there."""
    readme = (ROOT / "bench" / "README.md").read_text()
    scripts = {p.name for p in (ROOT / "bench").iterdir() if p.suffix in (".py", ".sh")}
    named = set(re.findall(r"`([a-z_]+\.(?:py|sh))", readme))
    assert scripts - {"__init__.py"} <= named, scripts - named
    results = {p.name for p in (ROOT / "bench" / "results").iterdir()}
    named_results = set(re.findall(r"`([\w.-]+\.(?:json|log))`", readme))
    assert results == named_results, (results ^ named_results)
    for name in results:
        script, machine, date = RESULT_NAME.fullmatch(name).groups()
        assert f"{script}.py" in scripts, name


def results_by_plan(folder):
    """The result files of `folder` grouped by what they measured: the script, the
    machine of the name, and the command's options less `--out` and `--rounds` (a rerun
    of the same plan), in any order."""
    plans = {}
    for path in sorted(folder.glob("*.json")):
        script, machine, date = RESULT_NAME.fullmatch(path.name).groups()
        options = []  # each option with its values: ["--sizes", "1000", "4000"]
        for word in (json.loads(path.read_text()).get("command") or "").split()[2:]:
            if word.startswith("--") or not options:
                options.append([word])
            else:
                options[-1].append(word)
        plan = sorted(tuple(o) for o in options if o[0] not in ("--out", "--rounds"))
        plans.setdefault((script, machine, tuple(plan)), []).append(path.name)
    return plans


def test_one_result_is_kept_per_plan_and_cpu_kind():
    """bench/results/ holds one result per question and machine kind (bench/README.md):
    no two files are runs of the same script and plan on the same kind."""
    repeated = [names for names in results_by_plan(ROOT / "bench" / "results").values() if len(names) > 1]
    assert not repeated, f"runs of the same plan on the same kind: {repeated}; keep the newest"


def test_a_rerun_of_a_kept_plan_is_found(tmp_path):
    """The check above finds a rerun (other rounds, options in another order) beside the
    file it repeats, and tells runs of other plans apart."""
    kept = "python bench/models.py --models Ti/16 --precisions float32,bfloat16 --keras-api " \
           "--rounds 3 --fit-on arrays --contenders keras-tensorflow,keras-jax,hf-torch"
    rerun = "python bench/models.py --contenders keras-tensorflow,keras-jax,hf-torch --fit-on arrays " \
            "--keras-api --precisions float32,bfloat16 --rounds 5 --models Ti/16 --out x.json"
    other = rerun.replace("--fit-on arrays", "--fit-on tf.data")
    for name, command in [("models_epyc_2026-12-06T0121.json", kept),
                          ("models_epyc_2026-12-07T0900.json", rerun),
                          ("models_epyc_2026-12-07T1000.json", other),
                          ("models_xeon-amx_2026-12-07T1100.json", rerun)]:
        (tmp_path / name).write_text(json.dumps({"command": command}))
    assert sorted(results_by_plan(tmp_path).values()) == [
        ["models_epyc_2026-12-06T0121.json", "models_epyc_2026-12-07T0900.json"],
        ["models_epyc_2026-12-07T1000.json"], ["models_xeon-amx_2026-12-07T1100.json"]]


def test_results_are_named_by_machine_and_time(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    # Importing a bench module leaves the environment as it was (the processes this worker
    # starts later keep the suite's backend): imported afresh with KERAS_BACKEND unset.
    monkeypatch.delitem(sys.modules, "bench.models", raising=False)
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    from bench.models import cpu_identity, machine, machine_name, results_path

    assert "KERAS_BACKEND" not in os.environ

    # A result records the first processor's name, family and model (two EPYC hosts of
    # one model name differ by family), None where /proc/cpuinfo lacks one.
    cpuinfo = "".join(
        f"processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\n"
        f"model\t\t: 2\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2\n\n"
        for n, family in ((0, 26), (1, 25))
    )
    assert cpu_identity(cpuinfo) == dict(cpu="AMD EPYC", cpu_family=26, cpu_model=2)
    assert cpu_identity("model name\t: Apple M2\n") == dict(cpu="Apple M2", cpu_family=None,
                                                           cpu_model=None)
    if Path("/proc/cpuinfo").exists():
        assert {k: machine()[k] for k in ("cpu", "cpu_family", "cpu_model")} == cpu_identity(
            Path("/proc/cpuinfo").read_text())

    assert machine_name(dict(cpu="Intel(R) Xeon(R) Processor", cpu_flags=["avx2", "amx_bf16"])) == "xeon-amx"
    assert machine_name(dict(cpu="AMD EPYC 7B13 64-Core Processor", cpu_flags=["avx2"])) == "epyc-7b13-64-core"
    assert machine_name(dict(cpu="x", cpu_flags=["amx_bf16"]), device="NVIDIA H200") == "h200"
    path = Path(results_path("memory"))
    assert path.parent == ROOT / "bench" / "results"
    assert re.fullmatch(rf"memory_{machine_name()}_\d{{4}}-\d\d-\d\dT\d{{4}}\.json", path.name)
