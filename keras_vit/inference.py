"""Classifying image files with a model: the top-k classes, named, with probabilities.

Files, folders and glob patterns are expanded to image files
(`keras_vit.utils.image_files.image_paths`), decoded in
parallel threads a few batches ahead of the model, and classified a batch at a time
(`classify`): brought to the model's size, or for a NaFlex model (or any other on
request, as its NaFlex twin) each resized, aspect kept, within a token budget.
"""

import collections
import concurrent.futures
import functools
import logging
import os
import weakref

import keras
import numpy as np

from keras_vit.data import naflex_inputs, read_images, read_pixels
from keras_vit.models.naflex_mode import (
    is_naflex,
    naflex_budget,
    naflex_preprocessing,
    naflex_twin,
)
from keras_vit.models.preprocessing import model_preprocessing
from keras_vit.models.vit import default_image_size, vit_parts
from keras_vit.utils.checks import check_choice, check_positive_int
from keras_vit.utils.devices import cpu_flags, device_name
from keras_vit.utils.image_files import image_paths
from keras_vit.weights import registry

logger = logging.getLogger("keras_vit")

# Decoding and resizing wait in libjpeg and NumPy, which release the GIL: threads overlap
# them with the model's batch.
DECODE_THREADS = max(2, os.cpu_count() or 1)

PRECISIONS = ("float32", "bfloat16", "auto")
# The CPU flags of bfloat16 products in hardware: AVX-512 BF16's dot products, AMX's
# matrix units. Without them bfloat16 is emulated, slower than float32.
BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# Keras' policy of each precision: bfloat16 products and activations, float32 weights (the
# model's own values) and a float32 head (float32 logits).
POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16"}
# The copy of each model that `with_precision` made, by the model and policy.
_copies = weakref.WeakKeyDictionary()


def auto_precision(device, flags):
    """The precision `"auto"` means on `device` (`keras_vit.utils.devices.device_name`:
    "cpu" or an accelerator's name) with the CPU's `flags`: bfloat16 on a CPU with
    bfloat16 products in hardware (`BFLOAT16_CPU_FLAGS`), else float32 (accelerators
    included: their 16-bit choice is not measured here).

    Example:

    >>> auto_precision("cpu", {"avx512f", "avx512_bf16"}), auto_precision("cpu", {"avx512f"})
    ('bfloat16', 'float32')
    >>> auto_precision("NVIDIA H200", {"amx_bf16"})
    'float32'
    """
    if device == "cpu" and flags & set(BFLOAT16_CPU_FLAGS):
        return "bfloat16"
    return "float32"


def with_precision(model, precision):
    """`model` computing in `precision`: itself where its dtype policy is that
    precision's (`POLICIES`), else a copy built with that policy holding its weights
    (float32 either way: the same values), compiled with the model's `jit_compile` where
    the model was compiled. The copy is kept for the next call with the same model and
    precision, its weights copied again each time.

    Args:
        model: a `keras_vit.ViT` model, not quantized.
        precision: `"float32"`, `"bfloat16"`, or `"auto"` (`auto_precision` on the
            device the backend computes on).

    Returns:
        A model with the same outputs, rounded to `precision`.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=3)
    >>> with_precision(model, "float32") is model
    True
    >>> with_precision(model, "bfloat16").dtype_policy.name
    'mixed_bfloat16'
    """
    check_choice("precision", precision, PRECISIONS)
    if precision == "auto":
        precision = auto_precision(device_name(keras.backend.backend()), cpu_flags())
    policy = POLICIES[precision]
    if model.dtype_policy.name == policy:
        return model
    config = model.get_config()
    if config.get("quantized"):
        raise ValueError(
            f"precision={precision!r} for a quantized model: it computes as it was "
            "quantized; leave precision out."
        )
    copies = _copies.setdefault(model, {})
    if policy not in copies:
        copies[policy] = type(model).from_config({**config, "dtype": policy})
        if model.compiled:  # its predict step compiled as the model's (XLA, torch.compile)
            copies[policy].compile(jit_compile=model.jit_compile)
    copy = copies[policy]
    copy.set_weights(model.get_weights())
    return copy


def decoded_batches(paths, read, *, batch_size=32, skip_unreadable=False):
    """Yields `(paths, images)` a batch at a time: each file read by `read(path)`, in
    threads that stay up to two batches ahead of the consumer.

    An unreadable file raises (naming it), or with `skip_unreadable` is logged and left
    out; the batches then hold the files that were read.
    """
    window = 2 * batch_size
    with concurrent.futures.ThreadPoolExecutor(DECODE_THREADS) as pool:
        pending = collections.deque((p, pool.submit(read, p)) for p in paths[:window])
        queued = len(pending)
        batch_paths, batch = [], []
        while pending:
            path, future = pending.popleft()
            if queued < len(paths):
                pending.append((paths[queued], pool.submit(read, paths[queued])))
                queued += 1
            try:
                image = future.result()
            except (OSError, ValueError) as error:
                if not skip_unreadable:
                    raise
                logger.warning("Skipped an unreadable file: %s", error)
                continue
            batch_paths.append(path)
            batch.append(image)
            if len(batch) == batch_size:
                yield batch_paths, batch
                batch_paths, batch = [], []
        if batch:
            yield batch_paths, batch


def classify(model, images, *, top_k=5, labels=None, activation=None, crop_fraction="model",
             batch_size=32, skip_unreadable=False, progress=None, naflex=None,
             max_num_patches=None, precision=None):
    """The `top_k` classes of each image file, as the checkpoint was evaluated.

    Each image is decoded, brought to the model's input size and normalised with the
    preprocessing the model's weights expect (`keras_vit.data.read_images` with
    `model_preprocessing(model)`): for the official ViT checkpoints the whole image
    resized bilinearly and scaled to [-1, 1], as vit_jax evaluates them; for DeiT
    ImageNet's mean and std, bicubic, timm's central crop.

    A NaFlex model (`keras_vit.ViT(naflex=True)`), or with `naflex=True` any other as
    its NaFlex twin (`keras_vit.models.naflex_mode.naflex_twin`: the same weights),
    takes each image at its own aspect ratio instead: a batch of images of mixed sizes
    goes through `keras_vit.naflex_inputs` (each resized, aspect kept, to the largest
    patch grid within `max_num_patches` tokens, by PIL's antialiased bilinear, and
    normalised with the model's mean and std: `naflex_preprocessing`).

    Args:
        model: a `keras_vit.ViT` model with a head, e.g. from `keras_vit.pretrained`.
        images: an image file, a folder or a glob pattern, or a list of them
            (`image_paths`).
        top_k: classes per image.
        labels: class names in class order; default: the label set of the model's
            registry checkpoint (`model.weights_entry`), else `"class {i}"`.
        activation: `"softmax"` or `"sigmoid"`; default: the checkpoint's (sigmoid for
            the ImageNet-21k heads, trained with the sigmoid cross-entropy), else softmax.
        crop_fraction: central crop of the preprocessing, or None for the whole image;
            `"model"` (default) takes the model's (`model_preprocessing(model)`). NaFlex
            takes no crop.
        batch_size: images per forward pass (the last batch is padded to it, so the
            model runs at one shape).
        skip_unreadable: log and leave out files that are not readable images (else
            the first one raises, naming it).
        progress: called as `progress(done, total)` after each batch.
        naflex: True runs a model that is not a NaFlex one as its NaFlex twin; None
            (default) uses NaFlex for NaFlex models only.
        max_num_patches: the NaFlex token budget per image; default: the model's
            (`naflex_budget`: the patches of its position table's grid).
        precision: None (default): the model as it is; `"float32"` or `"bfloat16"`: the
            model computing in that precision (`with_precision`: bfloat16 products,
            float32 weights and logits); `"auto"`: bfloat16 on a CPU with bfloat16
            products in hardware (AVX-512 BF16, AMX), else float32 (`auto_precision`).

    Returns:
        One dict per image read: `{"image": path, "top_k": [{"class": index, "label":
        name, "probability": p}, ...]}`, most probable first.

    Example:

    >>> import tempfile, tensorflow as tf, keras_vit
    >>> path = os.path.join(tempfile.mkdtemp(), "red.png")
    >>> tf.io.write_file(path, tf.io.encode_png(tf.constant([[[255, 0, 0]]], tf.uint8)))
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=3)
    >>> classify(model, path, top_k=1, labels=["a", "b", "c"])[0]["top_k"]
    [{'class': 0, 'label': 'a', 'probability': 0.3333333333333333}]
    >>> classify(model, path, top_k=1, naflex=True, max_num_patches=4)[0]["top_k"][0]["label"]
    'class 0'
    """
    paths = image_paths(images)
    entry = getattr(model, "weights_entry", None)
    if labels is None and entry is not None and entry.labels is not None:
        labels = registry.class_names(entry.labels)
    activation = activation or (entry.activation if entry is not None else "softmax")
    if activation not in ("softmax", "sigmoid"):
        raise ValueError(f"activation must be 'softmax' or 'sigmoid', got {activation!r}.")
    classes = model.output_shape[-1]
    if labels is not None and len(labels) != classes:
        raise ValueError(f"{len(labels)} labels for a model with {classes} classes.")
    for name, value in (("top_k", top_k), ("batch_size", batch_size)):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if naflex or is_naflex(model):  # a packed model serves as its one-image-per-row twin
        model = naflex_twin(model)
    read, model_inputs = _reader(model, crop_fraction, naflex, max_num_patches)
    if precision is not None:
        model = with_precision(model, precision)
    results = []
    for batch_paths, batch in decoded_batches(
        paths, read, batch_size=batch_size, skip_unreadable=skip_unreadable
    ):
        count = len(batch)
        inputs = model_inputs(batch)
        if count < batch_size and len(paths) > batch_size:  # one shape: no retracing
            inputs = keras.tree.map_structure(
                lambda a: np.concatenate([a, np.repeat(a[-1:], batch_size - count, axis=0)]),
                inputs,
            )
        logits = keras.ops.convert_to_numpy(model.predict_on_batch(inputs))[:count]
        results.extend(_top_k(batch_paths, logits.astype("float64"), activation, labels, top_k))
        if progress is not None:
            progress(len(results), len(paths))
    return results


def _reader(model, crop_fraction, naflex, max_num_patches):
    """`(read, model_inputs)` of `classify`: one file to an image, and a list of them to
    the model's input batch (NaFlex inputs for a NaFlex model, else at its size)."""
    if naflex is False and is_naflex(model):
        raise ValueError(
            f"naflex=False, but model {model.name!r} is a NaFlex model: it takes images "
            "only as NaFlex patches; leave naflex out."
        )
    if not is_naflex(model):
        if max_num_patches is not None:
            raise ValueError(
                f"max_num_patches={max_num_patches!r} is a NaFlex token budget, but model "
                f"{model.name!r} takes images at its own size: pass naflex=True (--naflex) "
                "too, or leave it out."
            )
        preprocessing = model_preprocessing(model)
        if crop_fraction == "model":
            crop_fraction = preprocessing["crop_fraction"]
        read = functools.partial(
            _read_at_size, image_size=default_image_size(model), channels=model.input_shape[-1],
            crop_fraction=crop_fraction, preprocessing=preprocessing,
        )
        return read, np.stack
    if crop_fraction not in ("model", None):
        raise ValueError(
            f"crop_fraction={crop_fraction!r} crops to the model's size, but NaFlex takes "
            "each whole image at its own aspect ratio: leave it out."
        )
    budget = naflex_budget(model) if max_num_patches is None else check_positive_int(
        "max_num_patches", max_num_patches)
    preprocessing = naflex_preprocessing(model)
    patches = vit_parts(model).patches
    return (
        functools.partial(read_pixels, channels=patches.channels),
        functools.partial(naflex_inputs, patch_size=patches.patch_size, max_num_patches=budget,
                          preprocessing=preprocessing),
    )


def _read_at_size(path, **kwargs):
    """One image file as `read_images` brings it to the model's size."""
    return read_images([path], **kwargs)[0]


def _top_k(paths, logits, activation, labels, top_k):
    """The result dicts of `classify` for a batch of logits."""
    if activation == "softmax":
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probabilities = shifted / shifted.sum(axis=-1, keepdims=True)
    else:
        probabilities = 1 / (1 + np.exp(-logits))
    for path, row in zip(paths, probabilities):
        best = np.argsort(-row, kind="stable")[:top_k]
        top = [
            {
                "class": int(i),
                "label": labels[i] if labels is not None else f"class {i}",
                "probability": float(row[i]),
            }
            for i in best
        ]
        yield {"image": os.fspath(path), "top_k": top}
