"""Decoding and geometry: image files to pixels, crops and resizes (TensorFlow-only).

`decode_pixels` decodes any of the image formats to 1 or 3 channels, `decode_crop`
decodes a payload inside a crop window (JPEGs only inside it), the
`*_window` functions draw windows, and `eval_resize` / `central_crop` bring images to
the model's size as evaluation does. `read_images` reads files as one batch of inputs.
"""

import os

import keras
import tensorflow as tf

from keras_vit.data import headers
from keras_vit.models.vit import preprocess
from keras_vit.utils.checks import check_in_range


def to_channels(image, channels):
    """`image` with `channels` channels (grey <-> RGB, alpha dropped)."""
    have = image.shape[-1]
    if have == channels:
        return image
    if have == 1 and channels == 3:
        return tf.image.grayscale_to_rgb(image)
    if have in (3, 4) and channels == 1:
        return tf.image.rgb_to_grayscale(image[..., :3])
    if have == 4 and channels == 3:
        return image[..., :3]
    raise ValueError(f"Cannot convert {have}-channel images to {channels} channels.")


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def decode_pixels(payload, channels):
    """uint8 pixels `(height, width, channels)` of an encoded JPEG, PNG, GIF, BMP or WebP
    file (an animation's first frame), whatever its name says.

    Args:
        payload: a scalar string tensor, the file's bytes.
        channels: 1 or 3 (grey and colour files converted), or 0 (as stored).

    Example:

    >>> png = tf.io.encode_png(tf.fill([2, 3, 3], tf.constant(7, tf.uint8)))
    >>> decode_pixels(png, 1).shape
    TensorShape([2, 3, 1])
    """

    def decode(channels):
        return tf.io.decode_image(payload, channels=channels, expand_animations=False)

    if channels != 1:
        image = decode(channels)
    else:
        # The GIF, BMP and WebP decoders give no grey: their colour is converted.
        own_grey = tf.logical_or(
            tf.io.is_jpeg(payload), tf.strings.substr(payload, 0, 8) == PNG_SIGNATURE
        )
        image = tf.cond(own_grey, lambda: decode(1), lambda: tf.image.rgb_to_grayscale(decode(3)))
    image.set_shape([None, None, channels or None])
    return image


def decode_crop(payload, encoded, channels, window_fn):
    """Decodes `payload` and cuts the window `window_fn(shape) -> (offset, size)`.

    JPEGs are decoded only inside the window (`decode_and_crop_jpeg`), which is what
    makes inception crops cheap at 224 px.
    """
    if not encoded:
        image = to_channels(payload, channels)
        offset, size = window_fn(tf.shape(image))
        return tf.slice(image, offset, size)

    def jpeg():
        offset, size = window_fn(tf.image.extract_jpeg_shape(payload))
        window = tf.stack([offset[0], offset[1], size[0], size[1]])
        return tf.image.decode_and_crop_jpeg(payload, window, channels=channels)

    def other():
        image = decode_pixels(payload, channels)
        offset, size = window_fn(tf.shape(image))
        return tf.slice(image, offset, size)

    image = tf.cond(tf.io.is_jpeg(payload), jpeg, other)
    image.set_shape([None, None, channels])
    return image


def inception_crop_window(seed, area_range=(0.05, 1.0), aspect_ratio_range=(3 / 4, 4 / 3)):
    """A `window_fn` drawing the inception crop: a random window covering
    `area_range` of the image with aspect ratio in `aspect_ratio_range`.

    Example:

    >>> offset, size = inception_crop_window([0, 1])(tf.constant([32, 32, 3]))
    >>> int(size[2])
    -1
    """

    def window(shape):
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape,
            bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
            seed=seed,
            min_object_covered=0.0,
            aspect_ratio_range=aspect_ratio_range,
            area_range=area_range,
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        return begin, size

    return window


def full_window(shape):
    """The `window_fn` of the whole image."""
    return tf.zeros([3], tf.int32), tf.stack([shape[0], shape[1], -1])


def resize_square(image, image_size, channels):
    """Bilinear resize to `(image_size, image_size, channels)` with a static shape."""
    image = tf.image.resize(image, (image_size, image_size), method="bilinear")
    image.set_shape([image_size, image_size, channels])
    return image


def central_crop(image, image_size, crop_fraction):
    """Resizes the short side to `image_size / crop_fraction`, then cuts the central
    `image_size` square: the eval preprocessing (big_vision's resize_small + central_crop).
    `image` is one image `(height, width, channels)` or a batch of images of one size.

    Example:

    >>> tuple(central_crop(tf.zeros((48, 64, 3)), 32, 0.875).shape)
    (32, 32, 3)
    """
    shape = tf.cast(tf.shape(image)[-3:-1], tf.float32)
    scale = (image_size / crop_fraction) / tf.reduce_min(shape)
    resized = tf.maximum(tf.cast(tf.round(shape * scale), tf.int32), image_size)
    image = tf.image.resize(image, resized, method="bilinear")
    top = (resized[0] - image_size) // 2
    left = (resized[1] - image_size) // 2
    image = image[..., top : top + image_size, left : left + image_size, :]
    image.set_shape(image.shape[:-3].concatenate([image_size, image_size, image.shape[-1]]))
    return image


def eval_resize(images, size, crop_fraction=None):
    """Images (one, or a batch of one size) brought to the model's `size`, as float32.

    `crop_fraction=None` resizes the whole image (bilinear), as the official vit_jax
    evaluation does for its checkpoints; a fraction in (0, 1] takes the `central_crop`
    of the engine's `eval_dataset` (a run's `evaluation.crop_fraction`), for square sizes.

    Example:

    >>> tuple(eval_resize(tf.zeros((2, 48, 64, 3)), (32, 32)).shape)
    (2, 32, 32, 3)
    """
    height, width = check_crop_fraction(crop_fraction, size)
    images = tf.cast(images, tf.float32)
    if crop_fraction is None:
        return tf.image.resize(images, (height, width), method="bilinear")
    return central_crop(images, height, crop_fraction)


def check_crop_fraction(crop_fraction, size):
    """Raises `ValueError` unless `eval_resize` takes `crop_fraction` for `size` (an int
    or `(height, width)`); returns `(height, width)`."""
    height, width = (size, size) if isinstance(size, int) else size
    if crop_fraction is None:
        return height, width
    check_in_range("crop_fraction", crop_fraction, "(0, 1]", " or None")
    if height != width:
        raise ValueError(
            f"A central crop (crop_fraction={crop_fraction}) needs a square model input, "
            f"got {height}x{width}; use crop_fraction=None to resize whole images."
        )
    return height, width


def read_images(paths, image_size, *, channels=3, crop_fraction=None):
    """Image files as one batch of model inputs, `(len(paths), size, size, channels)`.

    Checked without decoding first (`headers.image_problem`: damaged files and those
    over the pixel limit are refused), decoded (JPEG, PNG, GIF, BMP, WebP), brought to
    `image_size` by `eval_resize` (the whole image, or a run's central crop) and scaled
    to [-1, 1]. A missing, damaged or oversize file is an error naming it.

    Example:

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "grey.png")
    >>> tf.io.write_file(path, tf.io.encode_png(tf.fill([20, 30, 3], tf.constant(255, tf.uint8))))
    >>> read_images([path], 16).shape
    (1, 16, 16, 3)
    """
    images = []
    for path in paths:
        if not tf.io.gfile.exists(path):
            raise FileNotFoundError(f"No such image file: {path!r}.")
        payload = tf.io.read_file(path)
        problem = headers.image_problem(payload.numpy())
        if problem:
            raise ValueError(f"{path!r} is not a readable image: {problem}.")
        try:
            image = decode_crop(payload, True, channels, full_window)
        except tf.errors.InvalidArgumentError as error:
            reason = error.message.splitlines()[0]
            raise ValueError(f"{path!r} is not a readable image: {reason}") from None
        images.append(eval_resize(image, image_size, crop_fraction))
    return keras.ops.convert_to_numpy(preprocess(tf.stack(images).numpy()))
