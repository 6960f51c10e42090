"""A benchmark worker: one contender, one model, timed one round at a time.

`bench/models.py` starts one worker process per contender and model (Keras picks its
backend once per process) and keeps it alive, asking for one timed round at a time so
that the contenders alternate and drift on the machine cancels out. Requests and
replies are JSON lines on the worker's stdin and on a private copy of its stdout;
everything the libraries print goes to stderr.

    python bench/contenders.py keras-tensorflow   # then speaks the protocol on stdin

Contenders: `keras-tensorflow`, `keras-jax`, `keras-torch` (keras-vit on each Keras
backend, with the model's default compilation, `jit_compile="auto"`) and `hf-torch` (HF
transformers, eager PyTorch); on request (`TORCH_JIT`), `keras-torch-compiled` and
`keras-torch-eager`: keras-vit on PyTorch compiled with `jit_compile=True` (its steps
through `torch.compile`) and `jit_compile=False`, whatever "auto" picks. Families (`setup`'s `family`): `vit` (HF `ViTForImageClassification`),
`dinov2` (`Dinov2Model`) and `siglip` (`SiglipVisionModel`); the last two get a linear
1000-class head on their `pooler_output` in PyTorch, as keras-vit's head on the same
pooled features (`FAMILIES`), so that every contender computes logits.

Interfaces (`round`'s `interface`): `harness` times one step at a time on tensors made
once (Keras' `predict_on_batch` and `train_on_batch`; HF's forward under
`torch.no_grad`, and its training step); `keras-api` times the calls users make, on
numpy batches made once: one `model.predict(images, batch_size=batch)` over the
round's batches and one `model.fit` of the round's steps, from a repeated `tf.data`
dataset passed through `keras_vit.data.without_autotuning` (as keras-vit's own pipelines
are) on TensorFlow and JAX and from numpy arrays on PyTorch (everywhere with `setup`'s
`fit_on: "arrays"`); HF's peer converts
each numpy batch with `torch.from_numpy` and runs its forward under
`torch.inference_mode` (its training step as in the harness). A `keras-api` round
reports its time split evenly over its steps. PyTorch gets
`torch.set_num_threads(TORCH_THREADS)` on the CPU, TensorFlow and JAX keep their default
thread pools (one thread per core).

Training (`prepare("train")`) is AdamW with global-norm clipping at `CLIP_NORM` on each
side, as each package's training builds it: keras-vit's `make_optimizer("adamw")`
(weight decay on the kernels, the update fused on PyTorch) and, for HF, PyTorch's
`AdamW(fused=True)`, the `adamw_torch_fused` that HF's `Trainer` picks by default (with
PyTorch 2.8 or later), with `clip_grad_norm_`.

Precisions (`setup`'s `precision`):
- `float32`;
- `bfloat16`: keras-vit under Keras' `mixed_bfloat16` dtype policy (bfloat16 compute,
  float32 variables), HF under `torch.autocast(device, torch.bfloat16)`;
- `int8` (inference): keras-vit after `model.quantize("int8")` (int8 Dense kernels with
  per-channel scales), HF after PyTorch's dynamic int8 quantisation of its `Linear` layers
  (`torch.ao.quantization.quantize_dynamic`).
On a machine with a GPU every contender runs on it (HF with SDPA attention); the matmul
probe then runs in the contender's compute precision.
"""

import json
import os
import resource
import sys
import time

import numpy as np

from keras_vit.utils.devices import device_name  # noqa: F401  (bench/gpu_profile.py, digits_fit.py)

CONTENDERS = ("keras-tensorflow", "keras-jax", "keras-torch", "hf-torch")
# keras-vit on PyTorch with `jit_compile` set: its steps through `torch.compile`, or
# eager. Only on request (`--contenders`): compiling a model's steps takes minutes on a CPU.
TORCH_JIT = {"keras-torch-compiled": True, "keras-torch-eager": False}
INTERFACES = ("harness", "keras-api")
PRECISIONS = ("float32", "bfloat16", "int8")
TORCH_THREADS = 2
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01
CLIP_NORM = 1.0
MATMUL_SIZE = 2048
NUM_CLASSES = 1000
# The `keras_vit.ViT` switches of each family's HF reference (DINOv2: layer scale;
# SigLIP: the MAP head, tanh GELU), beside the architecture (`parse_variant`).
FAMILIES = {
    "vit": {},
    "dinov2": dict(layer_scale_init=1.0),
    "siglip": dict(classifier="map", gelu_approximate=True),
}


def peak_rss_mib():
    """This process's resident-set high-water mark (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds():
    """CPU time this process has used, all threads, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def page_faults():
    """`(major, minor)` page faults of this process so far: major ones read a page back
    from its file, minor ones map memory the process touches for the first time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_majflt, usage.ru_minflt


def _data(batch, image_size, channels_first):
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (batch, image_size, image_size, 3)).astype("float32")
    if channels_first:
        images = np.ascontiguousarray(images.transpose(0, 3, 1, 2))
    return images, rng.integers(0, NUM_CLASSES, batch)


class KerasViT:
    """keras-vit on the Keras backend this process was started with."""

    def __init__(self, arch, image_size, batch, precision, family="vit", jit_compile="auto",
                 fit_on="tf.data"):
        import keras

        import keras_vit

        if keras.backend.backend() == "torch":
            import torch

            torch.set_num_threads(TORCH_THREADS)
        keras.utils.set_random_seed(0)
        self.keras = keras
        self.precision = precision
        if precision == "bfloat16":
            keras.config.set_dtype_policy("mixed_bfloat16")
        self.model = keras_vit.ViT(
            image_size=image_size, num_classes=NUM_CLASSES, **arch, **FAMILIES[family]
        )
        if precision == "int8":
            self.model.quantize("int8")
        images, labels = _data(batch, image_size, channels_first=False)
        self.batch, self.numpy_images, self.numpy_labels = batch, images, labels
        self.images = keras.ops.convert_to_tensor(images)
        self.labels = keras.ops.convert_to_tensor(labels)
        self.jit_compile = jit_compile
        self.fit_on = fit_on
        self.mode = None

    def prepare(self, mode):
        keras = self.keras
        if mode == "train":
            from keras_vit.training.optimizers import make_optimizer

            self.model.compile(
                optimizer=make_optimizer("adamw", LEARNING_RATE, self.model,
                                         weight_decay=WEIGHT_DECAY, clip_norm=CLIP_NORM),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                jit_compile=self.jit_compile,
            )
        else:
            self.model.compile(jit_compile=self.jit_compile)
        self.mode = mode
        return {"jit_compile": self.model.jit_compile}

    def step(self):
        if self.mode == "train":
            return self.model.train_on_batch(self.images, self.labels)
        return self.model.predict_on_batch(self.images)

    def api_steps(self, steps):
        """A call (its inputs made, not yet run) of `steps` batches through
        `model.predict`, or of `steps` training steps of one `model.fit` (the
        `keras-api` interface)."""
        images, labels = repeated(self.numpy_images, steps), repeated(self.numpy_labels, steps)
        model = self.model
        if self.mode != "train":
            return lambda: model.predict(images, batch_size=self.batch, verbose=0)
        if self.keras.backend.backend() == "torch" or self.fit_on == "arrays":
            return lambda: model.fit(
                images, labels, batch_size=self.batch, epochs=1, shuffle=False, verbose=0
            )
        import tensorflow as tf

        from keras_vit.data import without_autotuning

        batches = without_autotuning(
            tf.data.Dataset.from_tensors((self.numpy_images, self.numpy_labels)).repeat()
        )
        return lambda: model.fit(batches, epochs=1, steps_per_epoch=steps, verbose=0)

    def matmul_gflops(self):
        return matmul_gflops(self.keras.backend.backend(), self.precision)

    def device_name(self):
        return device_name(self.keras.backend.backend())


def hf_classifier(family, arch, image_size):
    """The HF transformers model of `family` with architecture `arch`, as a torch module
    mapping `pixel_values` to 1000-class logits: `ViTForImageClassification`, or
    `Dinov2Model` / `SiglipVisionModel` with a linear head on `pooler_output`."""
    import torch
    import transformers

    sizes = dict(hidden_size=arch["hidden_dim"], num_hidden_layers=arch["num_layers"],
                 num_attention_heads=arch["num_heads"], patch_size=arch["patch_size"],
                 image_size=image_size, attn_implementation="sdpa")
    if family == "vit":
        config = transformers.ViTConfig(
            **sizes, intermediate_size=arch["mlp_dim"], num_labels=NUM_CLASSES,
            layer_norm_eps=1e-6, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )
        backbone, head = transformers.ViTForImageClassification(config), None
    elif family == "dinov2":
        # Dinov2Config takes the MLP width as an integer ratio (every variant's is 4).
        config = transformers.Dinov2Config(**sizes, mlp_ratio=arch["mlp_dim"] // arch["hidden_dim"])
        backbone = transformers.Dinov2Model(config)
    elif family == "siglip":
        config = transformers.SiglipVisionConfig(**sizes, intermediate_size=arch["mlp_dim"])
        backbone = transformers.SiglipVisionModel(config)
    else:
        raise ValueError(f"Unknown family {family!r}: expected one of {', '.join(FAMILIES)}.")
    if family != "vit":
        head = torch.nn.Linear(arch["hidden_dim"], NUM_CLASSES)

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone, self.head, self.config = backbone, head, backbone.config

        def forward(self, pixel_values):
            if self.head is None:
                return self.backbone(pixel_values=pixel_values).logits
            return self.head(self.backbone(pixel_values=pixel_values).pooler_output)

    return Classifier()


class HFViT:
    """HF transformers' model of a family (`hf_classifier`), eager PyTorch."""

    def __init__(self, arch, image_size, batch, precision, family="vit"):
        import contextlib

        import torch

        torch.set_num_threads(TORCH_THREADS)
        torch.manual_seed(0)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.precision = precision
        self.torch = torch
        self.model = hf_classifier(family, arch, image_size).to(self.device)
        if precision == "int8":
            self.model = torch.ao.quantization.quantize_dynamic(
                self.model, {torch.nn.Linear}, dtype=torch.qint8
            )
        self.autocast = (
            torch.autocast(self.device, dtype=torch.bfloat16)
            if precision == "bfloat16"
            else contextlib.nullcontext()
        )
        images, labels = _data(batch, image_size, channels_first=True)
        self.numpy_images, self.numpy_labels = images, labels
        self.images = torch.from_numpy(images).to(self.device)
        self.labels = torch.from_numpy(labels).to(self.device)
        self.mode = None

    def prepare(self, mode):
        torch = self.torch
        self.mode = mode
        if mode == "train":
            self.model.train()
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, fused=True
            )
        else:
            self.model.eval()
        return {"attn_implementation": self.model.config._attn_implementation}

    def step(self, images=None, labels=None):
        torch = self.torch
        images = self.images if images is None else images
        labels = self.labels if labels is None else labels
        if self.mode == "train":
            with self.autocast:
                logits = self.model(pixel_values=images)
                loss = torch.nn.functional.cross_entropy(logits.float(), labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP_NORM)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            return loss.item()
        with torch.no_grad(), self.autocast:
            logits = self.model(pixel_values=images)
        return logits.float().cpu()

    def api_steps(self, steps):
        """The `keras-api` peer, as a call: `steps` numpy batches, each converted with
        `torch.from_numpy`; inference under `torch.inference_mode`, the logits
        gathered as numpy as `model.predict` gathers them."""
        torch = self.torch
        images, labels = repeated(self.numpy_images, steps), repeated(self.numpy_labels, steps)
        starts = range(0, len(images), len(self.numpy_images))
        batches = [(images[i : i + len(self.numpy_images)], labels[i : i + len(self.numpy_images)])
                   for i in starts]

        def run():
            converted = [
                (torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device))
                for x, y in batches
            ]
            if self.mode == "train":
                return [self.step(x, y) for x, y in converted]
            outputs = []
            for x, _ in converted:
                with torch.inference_mode(), self.autocast:
                    outputs.append(self.model(pixel_values=x).float().cpu().numpy())
            return np.concatenate(outputs)

        return run

    def matmul_gflops(self):
        return matmul_gflops("torch", self.precision)

    def device_name(self):
        return device_name("torch")


def repeated(array, times):
    """`array` stacked `times` times along its first axis (a numpy copy)."""
    return np.concatenate([array] * times)


def timed_round(runner, interface, steps):
    """Seconds of each of `steps` steps of `runner` through `interface` (a
    `keras-api` round is timed whole and split evenly)."""
    if interface == "harness":
        return [timed(runner.step) for _ in range(steps)]
    if interface != "keras-api":
        raise ValueError(f"Unknown interface {interface!r}: expected one of {INTERFACES}.")
    return [timed(runner.api_steps(steps)) / steps] * steps


def matmul_gflops(framework, precision="float32"):
    """GFLOP/s of one `MATMUL_SIZE`^3 product: the probe of the matmul peak.

    XLA-compiled on `framework` "tensorflow" and "jax", eager on "torch"; in bfloat16
    for the `bfloat16` precision, else in float32 (int8 models keep float32 elsewhere,
    so the float32 peak is their reference). On the device the framework computes on.
    """
    a = np.random.default_rng(1).uniform(size=(MATMUL_SIZE, MATMUL_SIZE)).astype("float32")
    dtype = "bfloat16" if precision == "bfloat16" else "float32"
    if framework == "tensorflow":
        import tensorflow as tf

        a = tf.cast(tf.constant(a), dtype)
        matmul = tf.function(lambda: tf.matmul(a, a), jit_compile=True, autograph=False)
        run = lambda: matmul().numpy()
    elif framework == "jax":
        import jax

        a = jax.numpy.asarray(a, dtype)
        matmul = jax.jit(lambda x: x @ x)
        run = lambda: matmul(a).block_until_ready()
    else:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        a = torch.from_numpy(a).to(device, getattr(torch, dtype))
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        run = lambda: (a @ a, sync())
    return best_gflops(run)


def best_gflops(run, repeats=3):
    """GFLOP/s of a `MATMUL_SIZE`^3 product `run`, from its fastest of `repeats` calls."""
    run()
    best = min(timed(run) for _ in range(repeats))
    return 2 * MATMUL_SIZE**3 / best / 1e9


def timed(run):
    """Seconds `run()` takes."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def serve(contender, requests, replies):
    """Answers the driver's requests until it says `exit`.

    Requests: `{"op": "setup", "arch", "image_size", "batch", "precision", "family", "fit_on"}`
    (`arch`: the `keras_vit.ViT` architecture arguments, as `keras_vit.parse_variant`
    returns them; `family`: a `FAMILIES` name, default `vit`; `fit_on`: `tf.data`, the
    default, or `arrays`, what a `keras-api` `fit` reads on TensorFlow and JAX),
    `{"op": "prepare", "mode": "infer" | "train", "warmup", "interfaces"}` (compiles
    and runs untimed steps through each interface, default `["harness"]`),
    `{"op": "round", "steps", "interface"}` (timed steps, default through the
    harness, then a matmul probe), `{"op": "exit"}`.
    """
    runner = None
    for line in requests:
        request = json.loads(line)
        op = request["op"]
        start = time.perf_counter()
        if op == "exit":
            break
        if op == "setup":
            precision = request.get("precision", "float32")
            if precision not in PRECISIONS:
                raise ValueError(f"Unknown precision {precision!r}: expected one of {PRECISIONS}.")
            args = (request["arch"], request["image_size"], request["batch"], precision,
                    request.get("family", "vit"))
            runner = HFViT(*args) if contender == "hf-torch" else KerasViT(
                *args, jit_compile=TORCH_JIT.get(contender, "auto"),
                fit_on=request.get("fit_on", "tf.data"),
            )
            reply = {"device": runner.device_name()}
        elif op == "prepare":
            reply = runner.prepare(request["mode"])
            for interface in request.get("interfaces", ["harness"]):
                for _ in range(request["warmup"]):
                    timed_round(runner, interface, 1)
        elif op == "round":
            cpu, faults = cpu_seconds(), page_faults()
            interface = request.get("interface", "harness")
            reply = {"step_s": timed_round(runner, interface, request["steps"])}
            reply["cpu_s"] = cpu_seconds() - cpu
            reply["major_faults"], reply["minor_faults"] = (
                now - before for now, before in zip(page_faults(), faults)
            )
            reply["matmul_gflops"] = runner.matmul_gflops()
        else:
            raise ValueError(f"Unknown request op {op!r}: expected setup, prepare, round or exit.")
        reply.update(seconds=time.perf_counter() - start, peak_rss_mib=peak_rss_mib())
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main(argv):
    names = CONTENDERS + tuple(TORCH_JIT)
    if len(argv) != 1 or argv[0] not in names:
        raise SystemExit(f"usage: contenders.py {{{','.join(names)}}}, got {argv}")
    contender = argv[0]
    if contender.startswith("keras-"):
        os.environ["KERAS_BACKEND"] = "torch" if contender in TORCH_JIT else contender.split("-")[1]
        # keras-vit as the `keras-vit` command runs it: freed memory kept where that helps.
        from keras_vit.utils.allocator import configure_for_backend

        configure_for_backend()
    # Keep the protocol channel clean: libraries that print go to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(contender, sys.stdin, replies)


if __name__ == "__main__":
    main(sys.argv[1:])
