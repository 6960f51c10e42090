"""A benchmark worker: one contender, one model, timed one round at a time.

`bench/models.py` starts one worker process per contender and model (Keras picks its
backend once per process) and keeps it alive, asking for one timed round at a time so
that the contenders alternate and drift on the machine cancels out. Requests and
replies are JSON lines on the worker's stdin and on a private copy of its stdout;
everything the libraries print goes to stderr.

    python bench/contenders.py keras-tensorflow   # then speaks the protocol on stdin

Contenders: `keras-tensorflow`, `keras-jax`, `keras-torch` (keras-vit on each Keras
backend, with the model's default compilation) and `hf-torch` (HF transformers'
`ViTForImageClassification`, eager PyTorch). All run float32; PyTorch gets
`torch.set_num_threads(TORCH_THREADS)`, TensorFlow and JAX keep their default thread
pools (one thread per core).
"""

import json
import os
import resource
import sys
import time

import numpy as np

CONTENDERS = ("keras-tensorflow", "keras-jax", "keras-torch", "hf-torch")
TORCH_THREADS = 2
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01
CLIP_NORM = 1.0
MATMUL_SIZE = 2048
NUM_CLASSES = 1000


def peak_rss_mib():
    """This process's resident-set high-water mark (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds():
    """CPU time this process has used, all threads, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _data(batch, image_size, channels_first):
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (batch, image_size, image_size, 3)).astype("float32")
    if channels_first:
        images = np.ascontiguousarray(images.transpose(0, 3, 1, 2))
    return images, rng.integers(0, NUM_CLASSES, batch)


class KerasViT:
    """keras-vit on the Keras backend this process was started with."""

    def __init__(self, variant, arch, image_size, batch):
        import keras

        import keras_vit

        if keras.backend.backend() == "torch":
            import torch

            torch.set_num_threads(TORCH_THREADS)
        keras.utils.set_random_seed(0)
        self.keras = keras
        self.model = keras_vit.ViT(variant, image_size=image_size, num_classes=NUM_CLASSES)
        images, labels = _data(batch, image_size, channels_first=False)
        self.images = keras.ops.convert_to_tensor(images)
        self.labels = keras.ops.convert_to_tensor(labels)
        self.mode = None

    def prepare(self, mode):
        keras = self.keras
        if mode == "train":
            self.model.compile(
                optimizer=keras.optimizers.AdamW(
                    LEARNING_RATE, weight_decay=WEIGHT_DECAY, global_clipnorm=CLIP_NORM
                ),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        else:
            self.model.compile()
        self.mode = mode
        return {"jit_compile": self.model.jit_compile}

    def step(self):
        if self.mode == "train":
            return self.model.train_on_batch(self.images, self.labels)
        return self.model.predict_on_batch(self.images)

    def matmul_gflops(self):
        return matmul_gflops(self.keras.backend.backend())


class HFViT:
    """HF transformers' ViTForImageClassification, eager PyTorch."""

    def __init__(self, variant, arch, image_size, batch):
        import torch
        from transformers import ViTConfig, ViTForImageClassification

        torch.set_num_threads(TORCH_THREADS)
        torch.manual_seed(0)
        config = ViTConfig(
            hidden_size=arch["hidden_dim"],
            num_hidden_layers=arch["num_layers"],
            num_attention_heads=arch["num_heads"],
            intermediate_size=arch["mlp_dim"],
            patch_size=arch["patch_size"],
            image_size=image_size,
            num_labels=NUM_CLASSES,
            layer_norm_eps=1e-6,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        self.torch = torch
        self.model = ViTForImageClassification(config)
        images, labels = _data(batch, image_size, channels_first=True)
        self.images = torch.from_numpy(images)
        self.labels = torch.from_numpy(labels)
        self.mode = None

    def prepare(self, mode):
        torch = self.torch
        self.mode = mode
        if mode == "train":
            self.model.train()
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY
            )
        else:
            self.model.eval()
        return {"attn_implementation": self.model.config._attn_implementation}

    def step(self):
        torch = self.torch
        if self.mode == "train":
            logits = self.model(pixel_values=self.images).logits
            loss = torch.nn.functional.cross_entropy(logits, self.labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP_NORM)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            return loss.item()
        with torch.no_grad():
            return self.model(pixel_values=self.images).logits

    def matmul_gflops(self):
        return matmul_gflops("torch")


def matmul_gflops(framework):
    """GFLOP/s of one float32 `MATMUL_SIZE`^3 product: the probe of the matmul peak.

    XLA-compiled on `framework` "tensorflow" and "jax", eager on "torch".
    """
    a = np.random.default_rng(1).uniform(size=(MATMUL_SIZE, MATMUL_SIZE)).astype("float32")
    if framework == "tensorflow":
        import tensorflow as tf

        a = tf.constant(a)
        matmul = tf.function(lambda: tf.matmul(a, a), jit_compile=True, autograph=False)
        run = lambda: matmul().numpy()
    elif framework == "jax":
        import jax

        a = jax.numpy.asarray(a)
        matmul = jax.jit(lambda x: x @ x)
        run = lambda: matmul(a).block_until_ready()
    else:
        import torch

        a = torch.from_numpy(a)
        run = lambda: a @ a
    return _best_gflops(run)


def _best_gflops(run, repeats=3):
    run()
    best = min(_timed(run) for _ in range(repeats))
    return 2 * MATMUL_SIZE**3 / best / 1e9


def _timed(run):
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def serve(contender, requests, replies):
    """Answers the driver's requests until it says `exit`.

    Requests: `{"op": "setup", "variant", "arch", "image_size", "batch"}` (`arch` as
    `keras_vit.parse_variant` returns it),
    `{"op": "prepare", "mode": "infer" | "train", "warmup"}` (compiles and runs
    untimed steps), `{"op": "round", "steps"}` (timed steps, then a matmul
    probe), `{"op": "exit"}`.
    """
    runner = None
    for line in requests:
        request = json.loads(line)
        op = request["op"]
        start = time.perf_counter()
        if op == "exit":
            break
        if op == "setup":
            kind = HFViT if contender == "hf-torch" else KerasViT
            runner = kind(
                request["variant"], request["arch"], request["image_size"], request["batch"]
            )
            reply = {}
        elif op == "prepare":
            reply = runner.prepare(request["mode"])
            for _ in range(request["warmup"]):
                runner.step()
        elif op == "round":
            cpu = cpu_seconds()
            reply = {"step_s": [_timed(runner.step) for _ in range(request["steps"])]}
            reply["cpu_s"] = cpu_seconds() - cpu
            reply["matmul_gflops"] = runner.matmul_gflops()
        else:
            raise ValueError(f"Unknown request op {op!r}: expected setup, prepare, round or exit.")
        reply.update(seconds=time.perf_counter() - start, peak_rss_mib=peak_rss_mib())
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main(argv):
    if len(argv) != 1 or argv[0] not in CONTENDERS:
        raise SystemExit(f"usage: contenders.py {{{','.join(CONTENDERS)}}}, got {argv}")
    contender = argv[0]
    if contender.startswith("keras-"):
        os.environ["KERAS_BACKEND"] = contender.split("-", 1)[1]
    # Keep the protocol channel clean: libraries that print go to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(contender, sys.stdin, replies)


if __name__ == "__main__":
    main(sys.argv[1:])
