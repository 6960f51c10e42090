"""Benchmarks keras-vit against HF transformers' ViT, DINOv2 and SigLIP on this machine,
in one run.

    python bench/models.py            # the full table (40-50 minutes on 2 cores)
    python bench/models.py --quick    # a smoke run: Ti/16 at 224, 2 short rounds
    python bench/models.py --overhead # Ti/16 at 32 px, batch 1: Python and dispatch per step
    python bench/models.py --models dinov2-s14,siglip-b16  # only those rows
    python bench/models.py --out /tmp/models.json --contenders keras-tensorflow,hf-torch
    python bench/models.py --keras-api  # also through Keras' predict and fit (rows "keras-api")
    python bench/models.py --keras-api --fit-on arrays  # fit on NumPy arrays on every backend
    python bench/models.py --overhead --keras-api \
        --contenders keras-torch-eager,keras-torch-compiled,hf-torch  # torch.compile's steps
    python bench/models.py --models Ti/16 --precisions bfloat16 --processes 3  # 3 processes each

The DINOv2-S/14 and SigLIP-B/16 rows (224 px) time HF's `Dinov2Model` and
`SiglipVisionModel` with a linear 1000-class head on their `pooler_output` against
keras-vit's model of the same family (`bench/contenders.py` `FAMILIES`), random
weights. Each contender (see `bench/contenders.py`) runs in its own worker process that stays
alive; after one untimed round (first-run costs out of the figures), the driver asks the
workers for one timed round each in turn, rotating the order every round, so that
drift on a shared machine hits all of them alike. Figures
are medians over rounds; ratios are medians of the per-round ratios. A process can run
the same code faster or slower than another for its whole life; `--processes N` times
each row in N sets of fresh workers (started in a rotated order), pooling their rounds. Every round also
times a float32 2048^3 matmul in each worker's framework; the best of those in a round
is the machine's matmul peak for that round, and a run's "% of peak" is its model
FLOP rate (`keras_vit.models.flops.forward_flops`, three times that for a training step)
over that peak. Peak memory is each worker's RSS high-water mark after the phase,
imports included; a worker is started per model and resolution, so it covers that
model alone (inference, then inference plus training).

Rows come in three precisions (see `bench/contenders.py`): float32, bfloat16 (Keras'
`mixed_bfloat16` policy against HF under `torch.autocast`) and int8 inference (Keras'
`quantize("int8")` against PyTorch's dynamic int8 quantisation); each row's "x HF" is
against HF at the same precision, and the "% of peak" of a bfloat16 row is against the
bfloat16 matmul probe. With `--keras-api` every row is timed twice in the same
workers, alternated: through the harness (`predict_on_batch` and `train_on_batch` on
tensors made once) and through the calls users make (`model.predict` on numpy,
`model.fit` on a `tf.data` pipeline, or numpy on PyTorch; on numpy everywhere with
`--fit-on arrays`), HF's peer then running
under `torch.inference_mode` on numpy batches (see `bench/contenders.py`); a row's
"x HF" is against HF through the same interface. The machine's CPU flags that matter for reduced precision
(`avx512_bf16`, `amx_bf16`, `amx_int8`, ...) are recorded with the results.
"""

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.contenders import (  # noqa: E402
    CONTENDERS, FAMILIES, INTERFACES, PRECISIONS, TORCH_JIT, TORCH_THREADS,
)
from keras_vit.utils.devices import cpu_flags  # noqa: E402

REFERENCE = "hf-torch"
BATCH = 32
# (variant, precision, {mode: image sizes}[, {"batch": N} for that model]). Ti/16 at 384
# measures cost growth with tokens.
PLANS = {
    "full": dict(
        groups=[
            ("Ti/16", "float32", {"infer": (224, 384), "train": (224,)}),
            ("S/16", "float32", {"infer": (224,), "train": (224,)}),
            ("Ti/16", "bfloat16", {"infer": (224,), "train": (224,)}),
            ("S/16", "bfloat16", {"infer": (224,), "train": (224,)}),
            ("Ti/16", "int8", {"infer": (224,)}),
            # With --keras-api, its training in four workers at once needs more than 23 GB:
            # time it there in two runs (--contenders), HF beside each.
            ("dinov2-s14", "float32", {"infer": (224,), "train": (224,)}),
            # B/16 training at batch 32 in four workers at once needs more than 23 GB.
            ("siglip-b16", "float32", {"infer": (224,), "train": (224,)}, dict(batch=8)),
        ],
        rounds=3,
        steps={"infer": 3, "train": 2},
        warmup=2,
        batch=BATCH,
    ),
    "smoke": dict(  # a check that every path runs, in seconds: no figure to quote
        groups=[
            ("tiny", "float32", {"infer": (32,), "train": (32,)}),
            ("tiny-dinov2", "float32", {"infer": (32,), "train": (32,)}),
            ("tiny-siglip", "float32", {"infer": (32,), "train": (32,)}, dict(batch=2)),
        ],
        rounds=1,
        steps={"infer": 1, "train": 1},
        warmup=1,
        batch=4,
    ),
    # Ti/16 (12 blocks) on 32 px images, one at a time: the step's arithmetic is small,
    # so its time is the Python and dispatch of every layer and op, what a GPU waits on
    # (bench/gpu_profile.py).
    "overhead": dict(
        groups=[
            ("Ti/16", "float32", {"infer": (32,), "train": (32,)}),
            ("Ti/16", "bfloat16", {"infer": (32,), "train": (32,)}),
        ],
        rounds=5,
        steps={"infer": 30, "train": 10},
        warmup=5,
        batch=1,
    ),
    "quick": dict(
        groups=[("Ti/16", "float32", {"infer": (224,), "train": (224,)})],
        rounds=2,
        # Several batches a call: one `predict` of a single batch times mostly its set-up.
        steps={"infer": 3, "train": 2},
        warmup=1,
        batch=BATCH,
    ),
}
# The plans' models that are not paper ViTs: (a paper variant or an architecture, family).
TINY = dict(patch_size=8, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=64, resnet_stages=None)
MODELS = {
    "tiny": (TINY, "vit"),
    "tiny-dinov2": (TINY, "dinov2"),
    "tiny-siglip": (TINY, "siglip"),
    "dinov2-s14": ("S/14", "dinov2"),
    "siglip-b16": ("B/16", "siglip"),
}
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
TRAIN_FLOPS_FACTOR = 3  # forward + backward (two products per forward product)


def worker_environment():
    """The environment of a benchmark process: this checkout first on PYTHONPATH, then
    what the caller's holds (packages put beside the interpreter's own, as on a machine
    where nothing can be installed)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "3"}


class Worker:
    """A contender's process, spoken to in JSON lines."""

    def __init__(self, contender, log_dir):
        self.contender = contender
        self.log_path = Path(log_dir) / f"{contender}-{id(self)}.log"
        env = worker_environment()
        env.pop("KERAS_BACKEND", None)
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "contenders.py"), contender],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(self.log_path, "w"),
            text=True,
            env=env,
        )

    def send(self, **request):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()

    def receive(self):
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            log = self.log_path.read_text()[-4000:]
            code = self.process.returncode
            why = (" (SIGKILL: on Linux most likely the out-of-memory killer; time fewer "
                   "contenders at once with --contenders, HF beside each set)"
                   if code == -signal.SIGKILL else "")
            raise RuntimeError(
                f"benchmark worker {self.contender} exited with code {code}{why}; end of "
                f"its log:\n{log}"
            )
        return json.loads(line)

    def ask(self, **request):
        self.send(**request)
        return self.receive()

    def close(self):
        if self.process.poll() is None:
            self.send(op="exit")
            self.process.wait(timeout=60)


def model_flops(arch, image_size, family="vit"):
    """Forward FLOPs per image of the `keras_vit.ViT` with architecture arguments `arch`
    in `family` (`bench/contenders.py` `FAMILIES`)."""
    import keras

    from keras_vit import ViT
    from keras_vit.models.flops import forward_flops

    with keras.StatelessScope():
        return forward_flops(
            ViT(image_size=image_size, num_classes=1000, **arch, **FAMILIES[family])
        )


def model_arch(name):
    """The architecture arguments and family of a plan's model `name`: a `MODELS` entry
    or a paper variant."""
    from keras_vit.models.vit import parse_variant

    arch, family = MODELS.get(name, (name, "vit"))
    return (parse_variant(arch) if isinstance(arch, str) else arch), family


def _rotated(items, shift):
    shift %= len(items)
    return items[shift:] + items[:shift]


def run_group(variant, arch, precision, tasks, contenders, plan, log_dir, echo,
              interfaces=("harness",), family="vit"):
    """Times every contender on `arch` (named `variant`, of `family`) in `precision` for
    each (mode, image size) in `tasks`, through each of `interfaces`
    (`bench/contenders.py`).

    The timing runs `plan["processes"]` times (default 1), each time in fresh workers
    started in a rotated order, and a row's rounds are those of every process, in
    order (`process` says whose each is): one process can run the same code several
    percent faster than another for its whole life (docs/performance.md), which the
    rounds within one process do not average out."""
    timed = [
        _time_in_workers(
            variant, arch, precision, tasks, _rotated(list(contenders), process), plan,
            log_dir, echo, interfaces, family, process,
        )
        for process in range(plan.get("processes", 1))
    ]
    entries = []
    for mode in [mode for mode in ("infer", "train") if tasks.get(mode)]:
        for size in tasks[mode]:
            flops = model_flops(arch, size, family)
            if mode == "train":
                flops *= TRAIN_FLOPS_FACTOR
            # (process, reply) for each round of each process, in order.
            rounds = {
                (c, i): [(process, reply) for process, run in enumerate(timed)
                         for reply in run["rounds"][(c, size, mode, i)]]
                for c in contenders for i in interfaces
            }
            peaks = [max(reply["matmul_gflops"] for _, reply in same_round)
                     for same_round in zip(*rounds.values())]
            for c, i in [(c, i) for i in interfaces for c in contenders]:
                replies = [reply for _, reply in rounds[(c, i)]]
                prepared = [run["prepared"][(c, size, mode)] for run in timed]
                entries.append(
                    dict(
                        variant=variant,
                        precision=precision,
                        image_size=size,
                        mode=mode,
                        contender=c,
                        interface=i,
                        device=timed[0]["devices"][(c, size)],
                        batch=plan["batch"],
                        flops_per_image=flops,
                        images_per_s=[
                            plan["batch"] * len(x["step_s"]) / sum(x["step_s"]) for x in replies
                        ],
                        process=[process for process, _ in rounds[(c, i)]],
                        step_s=[x["step_s"] for x in replies],
                        cpu_s=[x["cpu_s"] for x in replies],
                        major_faults=[x["major_faults"] for x in replies],
                        minor_faults=[x["minor_faults"] for x in replies],
                        matmul_gflops=[x["matmul_gflops"] for x in replies],
                        round_peak_gflops=peaks,
                        peak_rss_mib=max(x["peak_rss_mib"] for x in replies),
                        compile_and_warmup_s=statistics.median(p["seconds"] for p in prepared),
                        settings={
                            k: v for k, v in prepared[0].items()
                            if k not in ("seconds", "peak_rss_mib")
                        },
                    )
                )
    return entries


def _time_in_workers(variant, arch, precision, tasks, contenders, plan, log_dir, echo,
                     interfaces, family, process):
    """One timing of `run_group`'s rows in fresh workers, started in `contenders`' order:
    `{"devices": {(contender, size): device}, "prepared": {(contender, size, mode):
    reply}, "rounds": {(contender, size, mode, interface): [reply per round]}}`."""
    batch = plan["batch"]
    sizes = sorted({size for mode_sizes in tasks.values() for size in mode_sizes})
    workers = {(c, size): Worker(c, log_dir) for c in contenders for size in sizes}
    prepared, rounds = {}, {}
    try:
        for (contender, size), worker in workers.items():
            worker.send(
                op="setup", arch=arch, image_size=size, batch=batch, precision=precision,
                family=family, fit_on=plan.get("fit_on", "tf.data"),
            )
        devices = {key: worker.receive()["device"] for key, worker in workers.items()}
        modes = [mode for mode in ("infer", "train") if tasks.get(mode)]
        for index, mode in enumerate(modes):
            sized = [(c, size) for c in contenders for size in tasks[mode]]
            for key in sized:
                workers[key].send(
                    op="prepare", mode=mode, warmup=plan["warmup"], interfaces=list(interfaces)
                )
            prepared.update({(*key, mode): workers[key].receive() for key in sized})
            keys = [(c, size, i) for c, size in sized for i in interfaces]
            of_process = f" (process {process + 1})" if plan.get("processes", 1) > 1 else ""
            echo(
                f"{variant} {precision} {mode}: compiled and warmed up; "
                f"timing {plan['rounds']} rounds{of_process}"
            )
            # One untimed round first, the timed rounds' calls in their order: a call's
            # first run at the timed length can grow the process's heap (JAX's `fit` of
            # the timed steps after a warm-up `fit` of one), and faulting that memory in
            # is a one-off cost (docs/performance.md).
            for key in keys:
                workers[key[:2]].ask(op="round", steps=plan["steps"][mode], interface=key[2])
            for c, size, i in keys:
                rounds[(c, size, mode, i)] = []
            for r in range(plan["rounds"]):
                for c, size, i in _rotated(keys, r):
                    reply = workers[(c, size)].ask(
                        op="round", steps=plan["steps"][mode], interface=i
                    )
                    rounds[(c, size, mode, i)].append(reply)
                    echo(
                        f"  round {r + 1} {c:<17} {size}px {i:<9} "
                        f"{batch * len(reply['step_s']) / sum(reply['step_s']):7.2f} img/s "
                        f"(page faults: {reply['major_faults']} major, "
                        f"{reply['minor_faults']} minor)"
                    )
            needed = {size for later in modes[index + 1 :] for size in tasks[later]}
            for key in [key for key in workers if key[1] not in needed]:
                workers.pop(key).close()
    finally:
        for worker in workers.values():
            worker.process.kill()
    return dict(devices=devices, prepared=prepared, rounds=rounds)


def summarise(entries):
    """Adds medians, ratios to HF, % of matmul peak, and the 224 -> 384 cost growth."""
    by_key = {_key(e): e for e in entries}
    for e in entries:
        rates = e["images_per_s"]
        e["median_images_per_s"] = statistics.median(rates)
        e["median_gflops_per_s"] = e["median_images_per_s"] * e["flops_per_image"] / 1e9
        # CPU seconds per wall second: how many cores the contender got on a shared machine.
        e["median_cores_used"] = statistics.median(
            cpu / sum(steps) for cpu, steps in zip(e["cpu_s"], e["step_s"])
        )
        e["median_fraction_of_peak"] = statistics.median(
            rate * e["flops_per_image"] / 1e9 / peak
            for rate, peak in zip(rates, e["round_peak_gflops"])
        )
        for name, other in (("vs_hf", REFERENCE), ("vs_tensorflow", "keras-tensorflow")):
            ref = by_key.get(_key(e, contender=other))
            if ref is not None and other != e["contender"]:
                e[f"ratio_{name}"] = statistics.median(
                    a / b for a, b in zip(rates, ref["images_per_s"])
                )
    growth = []
    for (variant, precision, size, mode, contender, interface), e in by_key.items():
        big = by_key.get(_key(e, image_size=384))
        if size != 224 or big is None:
            continue
        growth.append(
            dict(
                variant=variant,
                precision=precision,
                mode=mode,
                contender=contender,
                interface=interface,
                tokens=(_tokens(variant, 224), _tokens(variant, 384)),
                flop_ratio=big["flops_per_image"] / e["flops_per_image"],
                time_ratio=statistics.median(
                    a / b for a, b in zip(e["images_per_s"], big["images_per_s"])
                ),
            )
        )
    return growth


def _key(entry, **changes):
    """An entry's row key, with `changes` (e.g. `contender=`) in place of its own."""
    entry = {**entry, **changes}
    return tuple(
        entry.get(name, "harness") for name in
        ("variant", "precision", "image_size", "mode", "contender", "interface")
    )


def _tokens(variant, image_size):
    from keras_vit.models.vit import parse_variant

    return (image_size // parse_variant(variant)["patch_size"]) ** 2 + 1


def cpu_identity(cpuinfo):
    """The first processor's `model name`, `cpu family` and `model` in `/proc/cpuinfo`
    text `cpuinfo` (None for a field it lacks): a virtual machine's model name may be
    the bare vendor ("AMD EPYC"), and the family and model still tell its generations
    apart (AMD's family 25 is Zen 3 and 4, 26 Zen 5; tests/test_bench.py)."""
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor" and fields:
            break  # the first processor's fields only
        fields.setdefault(key, value.strip())

    def number(key):
        return int(fields[key]) if fields.get(key, "").isdigit() else None

    return dict(cpu=fields.get("model name"), cpu_family=number("cpu family"),
                cpu_model=number("model"))


def machine():
    cpuinfo = Path("/proc/cpuinfo")
    identity = cpu_identity(cpuinfo.read_text() if cpuinfo.exists() else "")
    present = cpu_flags()
    flags = [flag for flag in CPU_FLAGS if flag in present]
    versions = {}
    for name in ("keras", "tensorflow", "jax", "jaxlib", "torch", "transformers", "numpy"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return dict(
        cpu=identity["cpu"] or "unknown",
        cpu_family=identity["cpu_family"],
        cpu_model=identity["cpu_model"],
        cpu_flags=flags,
        cores=os.cpu_count(),
        platform=platform.platform(),
        python=platform.python_version(),
        versions=versions,
        threads=(
            f"torch.set_num_threads({TORCH_THREADS}) for hf-torch and keras-torch; "
            "TensorFlow and JAX (XLA) use their default pools, one thread per core"
        ),
    )


def machine_name(info=None, device=None):
    """A short name for the machine a result came from, for its file name: the GPU's
    (`device`, e.g. "NVIDIA H200" -> "h200") or the CPU's, with "-amx" where it has AMX
    ("Intel(R) Xeon(R) Processor" -> "xeon-amx", "AMD EPYC 7B13" -> "epyc-7b13")."""
    info = info or machine()
    name = device or info["cpu"]
    for noise in ("(R)", "(TM)", "Processor", "CPU", "Intel", "AMD", "NVIDIA"):
        name = name.replace(noise, " ")
    name = "-".join(name.split("@")[0].lower().split()) or "unknown"
    return name + ("-amx" if device is None and "amx_bf16" in info["cpu_flags"] else "")


def results_path(script, device=None):
    """Where `bench/SCRIPT.py` writes its result by default (bench/README.md lists them):
    `bench/results/SCRIPT_MACHINE_YYYY-MM-DDTHHMM.json`, MACHINE `machine_name`'s, the
    time the run started (UTC)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M")
    return str(ROOT / "bench" / "results" / f"{script}_{machine_name(device=device)}_{stamp}.json")


def format_table(entries, growth, peaks):
    def other_batch(e):  # a group timed at another batch than the header's
        return "" if e["batch"] == entries[0]["batch"] else f" (batch {e['batch']})"

    def per_process(e):  # each process's median img/s, where a row had several
        rates = {}
        for process, rate in zip(e.get("process", ()), e["images_per_s"]):
            rates.setdefault(process, []).append(rate)
        return " / ".join(f"{statistics.median(r):.1f}" for r in rates.values())

    several = any(len(set(e.get("process", ()))) > 1 for e in entries)
    lines = [
        f"batch {entries[0]['batch']}; machine matmul peak (median of per-round best): "
        + ", ".join(f"{precision} {peak:.0f} GFLOP/s" for precision, peak in peaks.items()),
        "",
        "| model | precision | px | task | contender | called through | img/s | x HF "
        "| GFLOP/s | % peak | cores used | peak RSS MiB |" + (" img/s per process |" if several else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if several else ""),
    ]
    for e in entries:
        ratio = e.get("ratio_vs_hf")
        lines.append(
            f"| {e['variant']}{other_batch(e)} | {e['precision']} | {e['image_size']} | {e['mode']} "
            f"| {e['contender']} | {e.get('interface', 'harness')} "
            f"| {e['median_images_per_s']:.1f} | {'' if ratio is None else f'{ratio:.2f}'} "
            f"| {e['median_gflops_per_s']:.0f} | {100 * e['median_fraction_of_peak']:.0f} "
            f"| {e['median_cores_used']:.2f} | {e['peak_rss_mib']:.0f} |"
            + (f" {per_process(e)} |" if several else "")
        )
    jax_vs_tf = [
        f"{e['variant']} {e['precision']} {e['image_size']} {e['mode']} "
        f"{e.get('interface', 'harness')}: "
        f"{e['ratio_vs_tensorflow']:.2f}"
        for e in entries
        if e["contender"] == "keras-jax" and "ratio_vs_tensorflow" in e
    ]
    if jax_vs_tf:
        lines += ["", "keras-jax / keras-tensorflow: " + "; ".join(jax_vs_tf)]
    if growth:
        lines += [
            "",
            "| model | precision | task | contender | called through | tokens "
            "| time per image x | FLOPs x |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for g in growth:
            lines.append(
                f"| {g['variant']} | {g['precision']} | {g['mode']} | {g['contender']} "
                f"| {g['interface']} "
                f"| {g['tokens'][0]} -> {g['tokens'][1]} | {g['time_ratio']:.2f} "
                f"| {g['flop_ratio']:.2f} |"
            )
    return "\n".join(lines)


def chosen(parser, what, text, choices):
    """The comma-separated names in `text`, or `parser`'s error naming those not in
    `choices` (`what` they are, e.g. "contenders")."""
    names = text.split(",")
    unknown = [name for name in names if name not in choices]
    if unknown:
        parser.error(f"unknown {what} {unknown}: expected some of {', '.join(choices)}")
    return names


def driver_backend():
    """Starts Keras on JAX in a benchmark's driver process, unless KERAS_BACKEND is set:
    a driver imports Keras only for shapes, inputs and FLOP counts, and JAX starts fastest
    and smallest. Called by the scripts' `main`, not on import, so that a program that
    imports a bench module keeps its own backend."""
    os.environ.setdefault("KERAS_BACKEND", "jax")


def main(argv=None):
    driver_backend()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run: Ti/16 at 224")
    parser.add_argument(
        "--overhead", action="store_true",
        help="Ti/16 at 32 px, batch 1: the time each step spends outside arithmetic",
    )
    parser.add_argument(
        "--smoke", action="store_true",
        help="a check that every path runs: a tiny model, one short round (no figures)",
    )
    parser.add_argument(
        "--keras-api", action="store_true",
        help="also time Keras' predict and fit (and HF under inference_mode) beside the harness",
    )
    parser.add_argument(
        "--fit-on", choices=("tf.data", "arrays"), default="tf.data",
        help="what --keras-api's fit reads on TensorFlow and JAX: a tf.data pipeline (the "
             "default) or NumPy arrays, as on PyTorch",
    )
    parser.add_argument("--out", default=results_path("models"))
    parser.add_argument(
        "--contenders", default=",".join(CONTENDERS),
        help=f"also {', '.join(TORCH_JIT)}: keras-vit on PyTorch with jit_compile on or off",
    )
    parser.add_argument("--rounds", type=int, help="override the plan's rounds")
    parser.add_argument(
        "--processes", type=int, default=1,
        help="time every row this many times, each in fresh worker processes (the rounds "
             "of each), so that one process's luck does not set a ratio",
    )
    parser.add_argument("--precisions", help="only the rows in these precisions")
    parser.add_argument(
        "--models", help="only the rows of these models of the plan (e.g. dinov2-s14,siglip-b16)"
    )
    args = parser.parse_args(argv)
    contenders = chosen(parser, "contenders", args.contenders, CONTENDERS + tuple(TORCH_JIT))
    precisions = chosen(parser, "precisions", args.precisions or ",".join(PRECISIONS), PRECISIONS)
    name = next((n for n in ("smoke", "quick", "overhead") if getattr(args, n)), "full")
    plan = dict(PLANS[name])
    interfaces = INTERFACES[::-1] if args.keras_api else ("harness",)  # Keras-API rows first
    models = dict.fromkeys(group[0] for group in plan["groups"])
    models = chosen(parser, "models", args.models, list(models)) if args.models else models
    plan["groups"] = [g for g in plan["groups"] if g[1] in precisions and g[0] in models]
    if not plan["groups"]:
        parser.error(f"the plan has no rows of {', '.join(models)} in {', '.join(precisions)}")
    if args.models and args.precisions:  # a pair asked for by name that the plan lacks
        missing = [f"{m} in {p}" for m in models for p in precisions
                   if not any(g[:2] == (m, p) for g in plan["groups"])]
        if missing:
            print(f"The plan has no rows of {', '.join(missing)}: running the others.")
    if args.rounds:
        plan["rounds"] = args.rounds
    if args.processes < 1:
        parser.error(f"--processes {args.processes}: expected 1 or more worker processes per row")
    plan["processes"] = args.processes
    plan["fit_on"] = args.fit_on
    echo = lambda text: print(text, file=sys.stderr, flush=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    entries = []
    with tempfile.TemporaryDirectory() as log_dir:
        for variant, precision, tasks, *options in plan["groups"]:  # options: e.g. its batch
            arch, family = model_arch(variant)
            entries += run_group(
                variant, arch, precision, tasks, contenders, {**plan, **dict(*options)}, log_dir,
                echo, interfaces, family,
            )
    growth = summarise(entries)
    peaks = {
        precision: statistics.median(
            p for e in entries if e["precision"] == precision for p in e["round_peak_gflops"]
        )
        for precision in dict.fromkeys(e["precision"] for e in entries)
    }
    table = format_table(entries, growth, peaks)
    print(table)
    result = dict(
        command=" ".join(["python bench/models.py", *(sys.argv[1:] if argv is None else argv)]),
        started=started.isoformat(timespec="seconds"),
        minutes=(datetime.datetime.now(datetime.timezone.utc) - started).total_seconds() / 60,
        load_average_before=load_before,
        load_average_after=os.getloadavg(),
        machine=machine(),
        plan={**plan, "contenders": contenders, "interfaces": list(interfaces)},
        matmul_peak_gflops=peaks,
        entries=entries,
        growth=growth,
        table=table,
    )
    Path(args.out).write_text(json.dumps(result, indent=1))
    echo(f"wrote {args.out}")


if __name__ == "__main__":
    main()
