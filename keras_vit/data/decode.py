"""Decoding and geometry in `tf.data`: image files to pixels, crops and resizes.

`decode_pixels` decodes any of the image formats to 1 or 3 channels, `decode_crop`
decodes a payload inside a crop window (JPEGs only inside it), the
`*_window` functions draw windows, and `eval_resize` / `central_crop` bring images to
the model's size as evaluation does. JPEGs are decoded with libjpeg's accurate integer
IDCT (`DCT_METHOD`), as PIL decodes them, so `keras_vit.data.images` (files to inputs
without TensorFlow) gets the same pixels.
"""

import tensorflow as tf

from keras_vit.data import headers
from keras_vit.models.preprocessing import resize_filter
from keras_vit.utils.checks import check_in_range

# libjpeg's JDCT_ISLOW, PIL's (TensorFlow's own default is the fast, less exact IDCT).
DCT_METHOD = "INTEGER_ACCURATE"


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
        return tf.cond(
            tf.io.is_jpeg(payload),
            lambda: tf.io.decode_jpeg(payload, channels=channels, dct_method=DCT_METHOD),
            lambda: tf.io.decode_image(payload, channels=channels, expand_animations=False),
        )

    if channels != 1:
        image = decode(channels)
    else:
        # The GIF, BMP and WebP decoders give no grey, nor libjpeg for CMYK: their colour
        # is converted.
        own_grey = tf.cond(
            tf.io.is_jpeg(payload),
            lambda: tf.logical_not(is_cmyk_jpeg(payload)),
            lambda: tf.strings.substr(payload, 0, 8) == headers.PNG_SIGNATURE,
        )
        image = tf.cond(own_grey, lambda: decode(1), lambda: tf.image.rgb_to_grayscale(decode(3)))
    image.set_shape([None, None, channels or None])
    return image


def is_cmyk_jpeg(payload, shape=None):
    """Whether the JPEG `payload` (its `extract_jpeg_shape`, when read already) has four
    components: CMYK or YCCK, which libjpeg converts to RGB but not to grey."""
    if shape is None:
        shape = tf.image.extract_jpeg_shape(payload)
    return tf.equal(shape[2], 4)


def encoded_size(payload):
    """`[width, height]` (int64) an encoded file's header declares, read in the graph
    without decoding (the SavedModel's counterpart of `headers.image_problem`, which
    runs in Python): JPEG, PNG, GIF, BMP and WebP; `[0, 0]` for other bytes, which the
    decoders refuse.

    Example:

    >>> png = tf.io.encode_png(tf.zeros([5, 7, 1], tf.uint8))
    >>> [int(side) for side in encoded_size(png)]
    [7, 5]
    """
    # The first 32 bytes, zero-padded, as integers: every header field read here.
    head = tf.strings.substr(tf.strings.join([payload, b"\0" * 32]), 0, 32)
    b = tf.cast(tf.io.decode_raw(head, tf.uint8), tf.int64)

    def number(start, length, big_endian=False):
        order = range(length - 1, -1, -1) if big_endian else range(length)
        return sum(b[start + i] * 256**k for k, i in enumerate(order))

    def signed(value):  # a 32-bit two's complement field (BMP heights may be negative)
        return tf.abs(tf.where(value >= 2**31, value - 2**32, value))

    def starts(kind, at=0):
        return kind == tf.strings.substr(head, at, len(kind))

    vp8l = number(21, 4)
    is_bmp_core = number(14, 4) == 12  # OS/2 BITMAPCOREHEADER: 16-bit sides
    def sides(width, height):
        return lambda: tf.stack([width, height])

    cases = [
        (starts(headers.PNG_SIGNATURE), sides(number(16, 4, True), number(20, 4, True))),
        (starts(b"GIF8"), sides(number(6, 2), number(8, 2))),
        (tf.logical_and(starts(b"BM"), is_bmp_core), sides(number(18, 2), number(20, 2))),
        (starts(b"BM"), sides(signed(number(18, 4)), signed(number(22, 4)))),
        (starts(b"WEBPVP8 ", 8), sides(number(26, 2) % 2**14, number(28, 2) % 2**14)),
        (starts(b"WEBPVP8L", 8), sides(vp8l % 2**14 + 1, vp8l // 2**14 % 2**14 + 1)),
        (starts(b"WEBPVP8X", 8), sides(number(24, 3) + 1, number(27, 3) + 1)),
        (tf.io.is_jpeg(payload),
         lambda: tf.cast(tf.image.extract_jpeg_shape(payload)[1::-1], tf.int64)),
    ]
    return tf.case(cases, default=sides(tf.constant(0, tf.int64), tf.constant(0, tf.int64)))


def limit_pixels(payload, max_pixels):
    """`payload` once the size its header declares (`encoded_size`) is at most
    `max_pixels` pixels (None: no limit), else an `InvalidArgumentError` naming the
    size and the limit, before anything is decoded."""
    if max_pixels is None:
        return payload
    width, height = tf.unstack(encoded_size(payload), num=2)
    check = tf.debugging.Assert(
        width * height <= max_pixels,
        [f"Image over the pixel limit of {max_pixels} ({headers.MAX_PIXELS_VARIABLE} when "
         "it was exported):", width, "x", height],
    )
    with tf.control_dependencies([check]):
        return tf.identity(payload)


def channel_note(source, channels):
    """A line saying how a source's images are converted to `channels`, or None when
    its (first) image has that many already.

    Args:
        source: a `keras_vit.data.Source`.
        channels: the channels the model takes.

    Example:

    >>> from keras_vit.data.sources import load_source
    >>> channel_note(load_source("digits", "test"), 3)
    'Images of digits:test have 1 channel and the model takes 3: the grey channel is repeated as they are read.'
    """
    key, _ = next(iter(source.records.take(1)))
    payload = source.read(key)
    if source.encoded:
        payload = decode_pixels(payload, 0)
    have = int(payload.shape[-1])
    if have == channels:
        return None
    how = "the grey channel is repeated" if have == 1 else (
        "they are converted to greyscale" if channels == 1 else "the alpha channel is dropped"
    )
    return (
        f"Images of {source.name} have {have} channel{'s' * (have > 1)} and the model takes "
        f"{channels}: "
        f"{how} as they are read."
    )


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
        shape = tf.image.extract_jpeg_shape(payload)
        offset, size = window_fn(shape)
        window = tf.stack([offset[0], offset[1], size[0], size[1]])

        def crop(channels):
            return tf.image.decode_and_crop_jpeg(payload, window, channels=channels,
                                                 dct_method=DCT_METHOD)

        if channels != 1:
            return crop(channels)
        return tf.cond(is_cmyk_jpeg(payload, shape),
                       lambda: tf.image.rgb_to_grayscale(crop(3)), lambda: crop(1))

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


def central_crop(image, image_size, crop_fraction, interpolation="bilinear", antialias=None):
    """Resizes the short side to `image_size / crop_fraction`, then cuts the central
    `image_size` square: the eval preprocessing (big_vision's resize_small + central_crop,
    timm's Resize + CenterCrop with `crop_pct`), with the filter of `resize`.
    `image` is one image `(height, width, channels)` or a batch of images of one size.

    Example:

    >>> tuple(central_crop(tf.zeros((48, 64, 3)), 32, 0.875).shape)
    (32, 32, 3)
    """
    shape = tf.cast(tf.shape(image)[-3:-1], tf.float32)
    scale = (image_size / crop_fraction) / tf.reduce_min(shape)
    resized = tf.maximum(tf.cast(tf.round(shape * scale), tf.int32), image_size)
    image = resize(image, resized, interpolation, antialias)
    top = (resized[0] - image_size) // 2
    left = (resized[1] - image_size) // 2
    image = image[..., top : top + image_size, left : left + image_size, :]
    image.set_shape(image.shape[:-3].concatenate([image_size, image_size, image.shape[-1]]))
    return image


def resize(images, size, interpolation="bilinear", antialias=None):
    """Float32 `images` resized to `size` with a checkpoint's filter (see
    `keras_vit.models.preprocessing`).

    Args:
        images: float32 pixels in [0, 255], one image or a batch.
        size: `(height, width)`.
        interpolation: `"bilinear"` or `"bicubic"`.
        antialias: False: TensorFlow's resize, as vit_jax evaluates (bilinear only);
            True: the filter widened when shrinking, as PIL's resize (timm's and HF's
            image processors); None: `interpolation`'s (`resize_filter`). Bicubic is
            clipped to [0, 255], as PIL's 8-bit result is.

    Example:

    >>> resize(tf.constant([[[0.0], [10.0]]]), (1, 4))[..., 0].numpy().tolist()
    [[0.0, 2.5, 7.5, 10.0]]
    """
    interpolation, antialias = resize_filter(interpolation, antialias)
    resized = tf.image.resize(images, size, method=interpolation, antialias=antialias)
    return tf.clip_by_value(resized, 0.0, 255.0) if interpolation == "bicubic" else resized


def eval_resize(images, size, crop_fraction=None, interpolation="bilinear", antialias=None):
    """Images (one, or a batch of one size) brought to the model's `size`, as float32.

    `crop_fraction=None` resizes the whole image, as the official vit_jax
    evaluation does for its checkpoints; a fraction in (0, 1] takes the `central_crop`
    of the engine's `eval_dataset` (a run's `evaluation.crop_fraction`), for square sizes.
    `interpolation` and `antialias` are the checkpoint's resize filter (see `resize`).

    Example:

    >>> tuple(eval_resize(tf.zeros((2, 48, 64, 3)), (32, 32)).shape)
    (2, 32, 32, 3)
    """
    height, width = check_crop_fraction(crop_fraction, size)
    images = tf.cast(images, tf.float32)
    if crop_fraction is None:
        return resize(images, (height, width), interpolation, antialias)
    return central_crop(images, height, crop_fraction, interpolation, antialias)


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
