"""SavedModel export for serving: raw images in, probabilities and top-k classes out.

TensorFlow-only (SavedModel is a TensorFlow format). The exported graph holds the
eval preprocessing, so a client sends uint8 pixels or encoded image files.
"""

import json
import logging
import os

import keras
import numpy as np
import tensorflow as tf

from keras_vit import __version__
from keras_vit.data import check_crop_fraction, decode_pixels, eval_resize, limit_pixels
from keras_vit.data.headers import max_image_pixels
from keras_vit.export.records import (
    SAVED_MODEL_RECORD,
    check_export_target,
    image_input_size,
    naflex_description,
    naflex_entry,
    naflex_signature,
)
from keras_vit.models.naflex_mode import is_naflex, naflex_preprocessing, naflex_twin
from keras_vit.models.preprocessing import (
    DEFAULT,
    check_preprocessing,
    describe,
    model_preprocessing,
    resize_name,
    shift_and_scale,
)
from keras_vit.models.vit import preprocess, vit_parts
from keras_vit.utils.checks import check_choice
from keras_vit.utils.files import atomic_folder

logger = logging.getLogger("keras_vit")

ACTIVATIONS = ("softmax", "sigmoid")
CONFIG_FILE = SAVED_MODEL_RECORD  # where the export's record is, in its folder


def _check_backend():
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "jax"):
        raise RuntimeError(
            f"SavedModel export needs the TensorFlow or JAX backend, but Keras runs on "
            f"{backend!r}. Save the model (model.save('model.keras')), then export it "
            "from a process started with KERAS_BACKEND=tensorflow (or jax): "
            "`keras_vit.export_saved_model(keras.saving.load_model('model.keras'), path)`."
        )


def _num_classes(model):
    shape = tuple(model.outputs[0].shape) if len(model.outputs) == 1 else None
    try:
        has_head = vit_parts(model).head is not None
    except ValueError:  # not a keras-vit ViT
        has_head = False
    if not has_head or len(shape or ()) != 2 or not isinstance(shape[1], int):
        shapes = [tuple(x.shape) for x in model.outputs]
        raise ValueError(
            "export_saved_model needs a classifier: a `head` layer and one "
            f"(batch, classes) output; model {model.name!r} has output shapes {shapes}"
            f"{'' if has_head else ' and no head'}. Build it with include_top=True."
        )
    return shape[1]


def _check_labels(labels, num_classes):
    if labels is None:
        return None
    labels = [str(label) for label in labels]
    if len(labels) != num_classes:
        raise ValueError(
            f"Got {len(labels)} labels for a model with {num_classes} classes: "
            "pass one label per class, in class-index order."
        )
    return labels


def _to_model_size(images, height, width, crop_fraction, interpolation, antialias):
    """Float32 pixels in [0, 255] at (height, width) (`eval_resize`); images already at
    that size are only cast."""
    shape = tf.shape(images)
    same_size = tf.logical_and(tf.equal(shape[1], height), tf.equal(shape[2], width))
    return tf.cond(
        same_size,
        lambda: tf.cast(images, tf.float32),
        lambda: eval_resize(images, (height, width), crop_fraction, interpolation, antialias),
    )


def _with_channels(images, channels, what, size=None):
    """`images` once its channel count is `channels` (and with `size`, its height and
    width are `size`), failing readably if not."""
    expected = [channels] if size is None else [*size, channels]
    check = tf.debugging.assert_equal(
        tf.shape(images)[-len(expected):],
        expected,
        message=f"{what} must have {channels} channels (the model's channel count)"
        + ("" if size is None else f" and height and width {size[0]}, {size[1]}"),
    )
    with tf.control_dependencies([check]):
        images = tf.identity(images)
    # Static shape only: tf.ensure_shape could fail before the check, unreadably.
    images.set_shape((None, *(size or (None, None)), channels))
    return images


def _at_own_size(images, multiple, pad, zero_pixel):
    """Float32 pixels of `images` at their own size: with `pad`, padded at the bottom
    and the right to multiples of `multiple` as the model's own padding does (done
    here so that the model is traced for multiples only: jax2tf must know that the
    patches divide the image); else failing readably unless they are multiples."""
    if pad:
        shape = tf.shape(images)
        extra = (multiple - shape[1:3] % multiple) % multiple
        # `zero_pixel` (127.5 for pixels scaled to [-1, 1], 255 * mean per channel) is
        # the model's zero once normalised, what its own padding adds.
        paddings = [[0, 0], [0, extra[0]], [0, extra[1]], [0, 0]]
        images = tf.cast(images, tf.float32)
        if zero_pixel.ndim == 0:
            return tf.pad(images, paddings, constant_values=float(zero_pixel))
        return tf.pad(images - zero_pixel, paddings) + zero_pixel
    check = tf.debugging.assert_equal(
        tf.shape(images)[1:3] % multiple,
        0,
        message=f"this SavedModel serves images at their own size, whose height and width "
        f"must be multiples of {multiple} (the model's patch size)",
    )
    with tf.control_dependencies([check]):
        return tf.cast(images, tf.float32)


def _outputs(scores, activation, top_k, labels):
    """The serving signatures' outputs for a batch of logits `scores`."""
    probabilities = tf.nn.softmax(scores) if activation == "softmax" else tf.sigmoid(scores)
    top = tf.math.top_k(probabilities, k=top_k)
    result = {
        "probabilities": probabilities,
        "top_k_indices": top.indices,
        "top_k_probabilities": top.values,
    }
    if labels is not None:
        result["top_k_labels"] = tf.gather(tf.constant(labels), top.indices)
    return result


def _naflex_serving(logits, signature, activation, top_k, labels):
    """The `serving_default` tf.function of a NaFlex export: its inputs (`signature`)
    to probabilities and the top-k classes, through `logits`."""
    specs = [tf.TensorSpec(spec.shape, spec.dtype, name=name) for name, spec in signature.items()]

    @tf.function(input_signature=specs, autograph=False)
    def serve(patches, patch_mask, spatial_shapes):
        inputs = _consistent_naflex(patches, patch_mask, spatial_shapes)
        return _outputs(logits(*inputs)["logits"], activation, top_k, labels)

    serve.get_concrete_function()
    return serve


def _consistent_naflex(patches, patch_mask, spatial_shapes):
    """The NaFlex inputs once their batch and token counts agree, failing readably if
    not (a loaded signature takes any shapes its specs allow)."""
    shapes = tf.shape(patches), tf.shape(patch_mask), tf.shape(spatial_shapes)
    checks = [
        tf.debugging.assert_equal(
            shapes[1], shapes[0][:2],
            message="patch_mask must be (batch, tokens) as patches (batch, tokens, P*P*C)"),
        tf.debugging.assert_equal(
            shapes[2][:1], shapes[0][:1],
            message="spatial_shapes must be (batch, 2), one row per image of patches"),
    ]
    with tf.control_dependencies(checks):
        return tf.identity(patches), tf.identity(patch_mask), tf.identity(spatial_shapes)


def _serving_functions(
    logits, image_size, channels, num_classes, crop_fraction, activation, top_k, labels,
    multiple=None, pad=False, preprocessing=None,
):
    """The `serving_default` and `serving_bytes` tf.functions around `logits`.

    `multiple` None brings every image to `image_size`; an int serves each image at
    its own size, whose sides must be multiples of it, or are padded to multiples of
    it with `pad`. `preprocessing` (the model's) gives the resize interpolation.
    """
    height, width = image_size
    native = multiple is not None
    preprocessing = check_preprocessing(preprocessing or DEFAULT)
    zero_pixel = shift_and_scale(preprocessing)[0]

    def pixels_for_model(images):
        if native:
            return _at_own_size(images, multiple, pad, zero_pixel)
        return _to_model_size(images, height, width, crop_fraction,
                              preprocessing["interpolation"], preprocessing["antialias"])

    def predictions(pixels):
        if not native:
            pixels.set_shape((None, height, width, channels))
        return outputs(logits(pixels)["logits"])

    def outputs(scores):
        return _outputs(scores, activation, top_k, labels)

    @tf.function(
        input_signature=[tf.TensorSpec((None, None, None, None), tf.uint8, name="images")],
        autograph=False,
    )
    def serve_images(images):
        images = _with_channels(images, channels, "images")
        return predictions(pixels_for_model(images))

    # decode_pixels converts grey and colour files to 1 or 3 channels; other channel
    # counts must be stored in the file as they are.
    decode_channels = channels if channels in (1, 3) else 0
    max_pixels = max_image_pixels()

    def decode(image_bytes):
        image = decode_pixels(limit_pixels(image_bytes, max_pixels), decode_channels)
        image = _with_channels(image[None], channels, "decoded images")
        return pixels_for_model(image)

    @tf.function(
        input_signature=[tf.TensorSpec((None,), tf.string, name="image_bytes")],
        autograph=False,
    )
    def serve_bytes(image_bytes):
        if native:  # one image at a time, each at its own size
            scores = tf.map_fn(
                lambda image: logits(decode(image))["logits"][0],
                image_bytes,
                fn_output_signature=tf.TensorSpec((num_classes,), tf.float32),
            )
            return outputs(scores)
        pixels = tf.map_fn(
            lambda image: decode(image)[0],
            image_bytes,
            fn_output_signature=tf.TensorSpec((height, width, channels), tf.float32),
        )
        return predictions(pixels)

    # ExportArchive takes a tf.function without an input signature once it is traced.
    serve_images.get_concrete_function()
    serve_bytes.get_concrete_function()
    return serve_images, serve_bytes


def _input_size(model, native_resolution):
    """`(height, width, channels)` the export brings images to (a `dynamic_image_size`
    model's trained size), and the multiple each side must be of at its own size
    (None unless `native_resolution`)."""
    shape = tuple(model.inputs[0].shape) if len(model.inputs) == 1 else ()
    dynamic = len(shape) == 4 and shape[1] is None and shape[2] is None
    if not dynamic:
        if native_resolution:
            raise ValueError(
                "native_resolution=True serves each image at its own size, which needs a "
                "model built with keras_vit.ViT(..., dynamic_image_size=True); model "
                f"{model.name!r} takes input shape {shape} only."
            )
        return image_input_size(model, "export_saved_model"), None
    parts = vit_parts(model)
    return (*parts.image_size, shape[3]), parts.stride if native_resolution else None


def export_saved_model(
    model, path, *, labels=None, top_k=5, activation="softmax", crop_fraction="model",
    native_resolution=False, metadata=None, overwrite=False,
):
    """Exports a classifier as a SavedModel that takes raw images, for serving.

    The SavedModel has three signatures:

    - `serving_default(images)`: a uint8 batch `(batch, height, width, channels)` of
      any height and width. Images are brought to the model's size as evaluation does
      (`keras_vit.data.eval_resize` with the interpolation of the model's preprocessing,
      `model_preprocessing(model)`: the whole image resized, or with `crop_fraction` a
      central crop) unless already at that size, and normalised as the model's
      weights expect (`keras_vit.preprocess`: scaled to [-1, 1] for the official ViT
      checkpoints, ImageNet's mean and std for DeiT).
    - `serving_bytes(image_bytes)`: a batch of encoded JPEG, PNG, GIF, BMP or WebP files
      (a string tensor of shape `(batch,)`), decoded and then treated as above. A file
      whose header declares more pixels than `$KERAS_VIT_MAX_IMAGE_PIXELS` at export
      (default 89,478,485, as Pillow's) is refused before it is decoded.
    - `logits(images)`: float32 pixels in [0, 255] at the model's size to `logits`
      (normalised inside, as above).

    With `native_resolution=True` (a model built with `dynamic_image_size=True`), no
    image is resized: `serving_default` runs a batch at its own size, `serving_bytes`
    each decoded image at its own size, and `logits` takes pixels whose height and
    width are multiples of the model's patch size. The images' height and width must
    be such multiples too, unless the model pads (`dynamic_image_pad=True`: they are
    padded as the model does). A `dynamic_image_size` model exported without it
    serves at the size its position table was trained at (its `image_size`).

    A NaFlex model (`keras_vit.ViT(naflex=True)`) is served on the inputs
    `keras_vit.naflex_inputs` makes (its pixels are PIL's, which a graph does not
    resize alike), of any batch and token count, with two signatures:
    `serving_default(patches, patch_mask, spatial_shapes)` (float32 `(batch, tokens,
    P * P * channels)`, int32 `(batch, tokens)`, int32 `(batch, 2)`) and `logits` of
    the same inputs. Its record says it is NaFlex, with its patch size, token budget
    and inputs (`naflex`: `keras_vit.export.records.naflex_entry`); it takes neither
    `crop_fraction` nor `native_resolution`.

    The serving signatures return `probabilities` (batch, classes), `top_k_indices`,
    `top_k_probabilities` (batch, top_k) and, with `labels`, `top_k_labels`.
    The model's config, the labels and the export options are written to
    `assets.extra/keras_vit.json` in the SavedModel folder.

    The folder is written beside `path` and swapped in whole
    (`keras_vit.utils.files.atomic_folder`): a process killed while exporting leaves
    the previous export at `path` as it was. It replaces only an earlier export (or an
    empty folder) unless `overwrite` (`keras_vit.export.records.check_export_target`).

    Models built under the TensorFlow or the JAX backend (converted with jax2tf)
    export; under PyTorch, save the model as `.keras` and export it from a
    TensorFlow or JAX process.

    Args:
        model: a classifier built by `keras_vit.ViT` (with `include_top=True`).
        path: the SavedModel folder to write.
        labels: optional class names, one per class in index order.
        top_k: how many of the most probable classes to return (at most all of them:
            a larger value is lowered to the number of classes, with a logged note).
        activation: `"softmax"`, or `"sigmoid"` for models trained with sigmoid
            cross-entropy (independent per-class probabilities).
        crop_fraction: `None` resizes whole images (the official checkpoints'
            evaluation); a fraction in (0, 1] crops as a run's `evaluation.crop_fraction`;
            `"model"` (default) is the model's preprocessing's (None when
            `native_resolution`).
        native_resolution: serve each image at its own size (see above) rather than
            resized to the model's.
        metadata: optional JSON-serialisable dict stored in the config file, e.g.
            the checkpoint and training config the model came from.
        overwrite: replace a folder at `path` that is not a keras-vit export (its
            files are lost).

    Returns:
        The dict written to `assets.extra/keras_vit.json`.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32,
    ...                       num_layers=2, num_heads=4, mlp_dim=64, num_classes=3)
    >>> _ = export_saved_model(model, "/tmp/vit", labels=["a", "b", "c"], top_k=2)
    >>> served = tf.saved_model.load("/tmp/vit").signatures["serving_default"]
    >>> out = served(images=tf.zeros((1, 50, 40, 3), tf.uint8))
    >>> out["top_k_labels"].shape.as_list()
    [1, 2]
    """
    _check_backend()
    check_export_target(path, "saved_model", overwrite=overwrite)
    naflex = is_naflex(model)
    if naflex:  # a packed model (images_per_row) serves one image per row
        model = naflex_twin(model)
    if naflex and (native_resolution or crop_fraction not in ("model", None)):
        given = "native_resolution=True" if native_resolution else f"crop_fraction={crop_fraction}"
        raise ValueError(
            f"{given} does not apply to NaFlex model {model.name!r}, which takes each whole "
            "image at its own aspect ratio as naflex_inputs makes it: leave it out."
        )
    preprocessing = naflex_preprocessing(model) if naflex else model_preprocessing(model)
    if crop_fraction == "model":
        crop_fraction = None if native_resolution or naflex else preprocessing["crop_fraction"]
    if naflex:
        (height, width), channels = vit_parts(model).image_size, vit_parts(model).patches.channels
        multiple, pad = None, False
    else:
        (height, width, channels), multiple = _input_size(model, native_resolution)
        pad = bool(native_resolution and model.get_config().get("dynamic_image_pad"))
    num_classes = _num_classes(model)
    labels = _check_labels(labels, num_classes)
    check_choice("activation", activation, ACTIVATIONS)
    check_crop_fraction(crop_fraction, (height, width))
    if native_resolution and crop_fraction is not None:
        raise ValueError(
            f"crop_fraction={crop_fraction} crops images to the model's size, but "
            "native_resolution=True serves each at its own: pass one or the other."
        )
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}.")
    if top_k > num_classes:
        logger.info("top_k %d is more than the model's %d classes: returning all %d.",
                    top_k, num_classes, num_classes)
        top_k = num_classes
    record = {
        "keras_vit_version": __version__,
        "keras_version": keras.__version__,
        "tensorflow_version": tf.__version__,
        "backend": keras.backend.backend(),
        "model": json.loads(model.to_json()),
        "image_size": [height, width],
        "channels": channels,
        "num_classes": num_classes,
        "activation": activation,
        "top_k": top_k,
        "labels": labels,
        "crop_fraction": crop_fraction,
        "max_image_pixels": max_image_pixels(),
        "native_resolution": bool(native_resolution),
        "preprocessing": naflex_description(model) if naflex else _description(
            preprocessing, crop_fraction, native_resolution, multiple, pad),
        "preprocessing_config": preprocessing,
        "signatures": ["serving_default", "serving_bytes", "logits"],
        "metadata": metadata,
    }
    if naflex:
        record.update(naflex=naflex_entry(model), signatures=["serving_default", "logits"])
        del record["max_image_pixels"]  # no image is decoded in the graph
    try:
        record_json = json.dumps(record, indent=2)
    except TypeError as error:
        raise ValueError(
            f"metadata must be JSON-serialisable, got {metadata!r}: {error}."
        ) from error

    archive = keras.export.ExportArchive()
    archive.track(model)
    if naflex:
        _naflex_endpoints(archive, model, activation, top_k, labels)
    else:
        _image_endpoints(
            archive, model, preprocessing, (height, width), channels, num_classes, crop_fraction,
            activation, top_k, labels, native_resolution, multiple, pad,
        )
    # Built beside `path` and swapped in whole: a kill leaves the previous export.
    with atomic_folder(path) as folder:
        archive.write_out(folder, verbose=False)
        config_path = os.path.join(folder, CONFIG_FILE)
        tf.io.gfile.makedirs(os.path.dirname(config_path))
        with tf.io.gfile.GFile(config_path, "w") as f:
            f.write(record_json)
    return record


def _description(preprocessing, crop_fraction, native_resolution, multiple, pad):
    """The preprocessing the image signatures apply, in words, for the record."""
    if native_resolution:
        return (
            "none: each image at its own size"
            + (f", padded at the bottom and the right to multiples of {multiple} with "
               f"{np.round(shift_and_scale(preprocessing)[0], 4).tolist()}" if pad
               else f" (height and width multiples of {multiple})")
            + f", then {describe(preprocessing)}"
        )
    return (
        f"{resize_name(preprocessing)} resize of the whole image"
        if crop_fraction is None
        else f"{resize_name(preprocessing)} resize of the short side to image_size "
        f"/ {crop_fraction}, central image_size crop"
    ) + f" unless already image_size, then {describe(preprocessing)}"


def _jax_options(polymorphic_shapes=None):
    """`add_endpoint`'s options under JAX (none on TensorFlow): lowered for every
    platform (not only this machine's), so that a model exported on a CPU serves on
    GPUs and TPUs; inference only, no gradients; with `polymorphic_shapes`, jax2tf's
    symbolic input shapes."""
    if keras.backend.backend() != "jax":
        return {}
    options = dict(native_serialization_platforms=("cpu", "cuda", "tpu"), with_gradient=False)
    if polymorphic_shapes is not None:
        options["polymorphic_shapes"] = polymorphic_shapes
    return {"jax2tf_kwargs": options}


def _naflex_endpoints(archive, model, activation, top_k, labels):
    """`logits` and `serving_default` of a NaFlex model: its three inputs, any batch and
    token count (`naflex_signature`), to logits and to probabilities and top-k."""
    signature = naflex_signature(model)

    def logits_from_patches(patches, patch_mask, spatial_shapes):
        if keras.backend.backend() == "tensorflow":  # jax2tf's module checks its own
            patches, patch_mask, spatial_shapes = _consistent_naflex(
                patches, patch_mask, spatial_shapes)
        inputs = {"patches": patches, "patch_mask": keras.ops.cast(patch_mask, "float32"),
                  "spatial_shapes": spatial_shapes}
        return {"logits": model(inputs, training=False)}

    width = signature["patches"].shape[-1]
    # Under JAX, one symbolic batch b and token count t that the inputs share.
    logits = archive.add_endpoint(
        "logits", logits_from_patches, input_signature=list(signature.values()),
        **_jax_options([f"(b, t, {width})", "(b, t)", "(b, 2)"]),
    )
    archive.add_endpoint(
        "serving_default", _naflex_serving(logits, signature, activation, top_k, labels))


def _image_endpoints(
    archive, model, preprocessing, image_size, channels, num_classes, crop_fraction,
    activation, top_k, labels, native_resolution, multiple, pad,
):
    """`logits`, `serving_default` and `serving_bytes` of a model that takes images."""
    height, width = image_size

    def logits_from_pixels(images):
        if keras.backend.backend() == "tensorflow":
            # A signature is called with any shape of tensor (TensorFlow Serving, a
            # loaded signature), which the graph would read as other images; jax2tf's
            # module checks its input shapes itself.
            fixed = None if native_resolution else (height, width)
            images = _with_channels(images, channels, "pixels", fixed)
        return {"logits": model(preprocess(images, preprocessing), training=False)}

    # Under JAX, add_endpoint converts this function with jax2tf; everything else is
    # plain TensorFlow around it, so the serving graph is the same for both backends.
    # Native sizes: symbolic sizes that the patches divide, as jax2tf must prove.
    polymorphic = [f"(b, {multiple}*h, {multiple}*w, {channels})"] if native_resolution else None
    pixels_size = (None, None) if native_resolution else (height, width)
    logits = archive.add_endpoint(
        "logits",
        logits_from_pixels,
        input_signature=[keras.InputSpec(shape=(None, *pixels_size, channels), dtype="float32")],
        **_jax_options(polymorphic),
    )
    serve_images, serve_bytes = _serving_functions(
        logits, (height, width), channels, num_classes, crop_fraction, activation, top_k,
        labels, multiple, pad, preprocessing,
    )
    archive.add_endpoint("serving_default", serve_images)
    archive.add_endpoint("serving_bytes", serve_bytes)
