"""Image files to model inputs without TensorFlow: `read_images` (`classify`, `keras-vit
predict`, `visualize`) on any backend.

Each step gives the pixels of its `tf.data` twin in `keras_vit.data.decode`, which the
training and evaluation pipelines and the SavedModel use: `decode_file` decodes with PIL
(JPEGs with libjpeg's accurate integer IDCT, as TensorFlow decodes them here, so the
bytes are the same; grey conversions as TensorFlow's), `resize` resamples with the
filter of a preprocessing (see `keras_vit.models.preprocessing`) in NumPy, and
`eval_resize` brings an image to the model's size as the evaluation does.
"""

import io
import logging
import os

import keras
import numpy as np
from PIL import Image

from keras_vit.data import headers, libjpeg
from keras_vit.models.preprocessing import DEFAULT, check_preprocessing, resize_filter
from keras_vit.models.vit import preprocess

logger = logging.getLogger("keras_vit")

# tf.image.rgb_to_grayscale's weights (ITU-R 601), for the decoders that give no grey.
GREY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], np.float32)
# libpng's rgb_to_gray weights (out of 2^15, truncated) for TensorFlow's 0.299 and 0.587:
# its PNG decoder's grey of a colour PNG.
PNG_GREY_WEIGHTS = (9797, 19234, 3737)
# PNG chunks (as PIL names them in `info`) declaring a colour space, with which libpng's grey
# conversion is gamma-corrected.
COLOUR_SPACE_CHUNKS = {"icc_profile", "gamma", "srgb", "chromaticity"}


def decode_file(payload, channels):
    """uint8 pixels `(height, width, channels)` of an encoded JPEG, PNG, GIF, BMP or WebP
    file (an animation's first frame), equal to `keras_vit.data.decode.decode_crop`'s
    of the whole image. Only a colour PNG declaring its colour space, read as grey, is
    decoded by TensorFlow (libpng's gamma-corrected conversion).

    Args:
        payload: the file's bytes.
        channels: 1 or 3 (grey and colour files converted).

    Raises:
        ValueError: the bytes do not decode (PIL's reason).

    Example:

    >>> buffer = io.BytesIO()
    >>> Image.new("RGB", (3, 2), (255, 0, 0)).save(buffer, "PNG")
    >>> decode_file(buffer.getvalue(), 1)[..., 0].tolist()
    [[76, 76, 76], [76, 76, 76]]
    """
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels!r}.")
    try:
        image = Image.open(io.BytesIO(payload))
        jpeg = image.format == "JPEG"
        if jpeg and channels == 1 and image.mode != "CMYK":
            image.draft("L", image.size)  # libjpeg's own grey (the luma), as TensorFlow's
        image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise ValueError(str(error) or error.__class__.__name__) from None
    if image.mode == "CMYK":  # JPEG only: colour as TensorFlow's decoder converts it
        pixels = cmyk_to_rgb(np.asarray(image))
    elif image.mode.startswith("I;16"):  # 16-bit grey PNG: its high byte, as libpng strips
        pixels = (np.asarray(image).astype(np.uint16) >> 8).astype(np.uint8)[..., None]
    elif image.mode in ("L", "RGB"):
        pixels = np.asarray(image)
    elif image.mode in ("LA", "I", "F", "1"):
        pixels = np.asarray(image.convert("L"))
    else:  # RGBA, P (palettes), ...: the colours, alpha dropped
        pixels = np.asarray(image.convert("RGB"))
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    if pixels.shape[-1] == channels:
        return pixels
    if channels == 3:
        return np.repeat(pixels, 3, axis=-1)
    if image.format == "PNG" and COLOUR_SPACE_CHUNKS & set(image.info):
        # libpng converts in linear light with the file's gamma: as TensorFlow, with it
        import tensorflow as tf

        return tf.io.decode_image(payload, channels=1, expand_animations=False).numpy()
    if image.format == "PNG":  # libpng's conversion: its weights, grey pixels kept as they are
        red, green, blue = (pixels[..., i].astype(np.int64) for i in range(3))
        r, g, b = PNG_GREY_WEIGHTS
        grey = np.where((red == green) & (green == blue), red,
                        (r * red + g * green + b * blue) >> 15)
        return grey.astype(np.uint8)[..., None]
    return rgb_to_grey(pixels)


def cmyk_to_rgb(cmyk):
    """RGB of a CMYK JPEG's pixels as PIL gives them, as TensorFlow's decoder converts
    them: `(255 - colour) (255 - black) / 255`, truncated."""
    ink = 255 - cmyk.astype(np.int64)
    return (ink[..., :3] * ink[..., 3:] // 255).astype(np.uint8)


def rgb_to_grey(pixels):
    """uint8 grey `(..., 1)` of uint8 RGB `pixels`, as `tf.image.rgb_to_grayscale`
    computes it (in float32, the result scaled by 255.5 and truncated)."""
    red, green, blue = np.moveaxis(pixels.astype(np.float32) * np.float32(1 / 255), -1, 0)
    weights = GREY_WEIGHTS
    grey = red * weights[0] + green * weights[1] + blue * weights[2]  # in TF's order, no FMA
    return np.clip(grey * np.float32(255.5), 0, 255).astype(np.uint8)[..., None]


def resize(pixels, size, interpolation="bilinear", antialias=None):
    """Float32 pixels `(height, width, channels)` resized to `size` as
    `keras_vit.data.decode.resize` (`tf.image.resize`) resizes them, to the bit.

    Args:
        pixels: uint8 pixels, or float32 pixels in [0, 255]. uint8 pixels are
            converted to float32 (exactly) only as the filter's taps gather them, so a
            large image costs its taps rather than a float32 copy of it all.
        size: `(height, width)`.
        interpolation: `"bilinear"` or `"bicubic"`.
        antialias: whether the filter widens when shrinking (PIL's), or None for
            `interpolation`'s (`resize_filter`).

    Returns:
        float32 pixels `(*size, channels)`.

    Example:

    >>> resize(np.array([[[0.0], [10.0]]], np.float32), (1, 4))[..., 0].tolist()
    [[0.0, 2.5, 7.5, 10.0]]
    """
    interpolation, antialias = resize_filter(interpolation, antialias)
    pixels = np.asarray(pixels)
    if pixels.dtype != np.uint8:
        pixels = pixels.astype(np.float32, copy=False)
    if not antialias:
        return _bilinear(pixels, size)
    rows = _spans(pixels.shape[0], size[0], interpolation)
    cols = _spans(pixels.shape[1], size[1], interpolation)
    resized = _gather(_gather(pixels, rows, axis=0), cols, axis=1)  # rows first, as TF
    return np.clip(resized, 0, 255) if interpolation == "bicubic" else resized


def _bilinear(pixels, size):
    """TensorFlow's `ResizeBilinear` with half-pixel centres, its float32 operations in
    its order (so the same bits)."""
    def taps(in_size, out_size):
        scale = np.float32(in_size) / np.float32(out_size)
        position = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale
        position = position - np.float32(0.5)
        floor = np.floor(position)
        lower = np.maximum(floor, 0).astype(np.int64)
        upper = np.minimum(np.ceil(position), in_size - 1).astype(np.int64)
        return lower, upper, (position - floor).astype(np.float32)

    top, bottom, y = taps(pixels.shape[0], size[0])
    left, right, x = taps(pixels.shape[1], size[1])
    channels = pixels.shape[-1]
    x = np.repeat(x, channels)  # rows as (width * channels): the products run along them

    def along_row(rows):
        def columns(index):
            return np.take(rows, index, axis=1).astype(np.float32).reshape(len(rows), -1)

        rows_left = columns(left)
        return rows_left + (columns(right) - rows_left) * x

    upper, lower = along_row(pixels[top]), along_row(pixels[bottom])
    return (upper + (lower - upper) * y[:, None]).reshape(*size, channels)


def _kernel(interpolation, x):
    """The triangle or Keys' a=-0.5 cubic at distances `x` (float32), as TensorFlow's."""
    x = np.abs(x)
    if interpolation == "bilinear":
        return np.where(x < 1, np.float32(1) - x, np.float32(0))
    near = ((np.float32(1.5) * x - np.float32(2.5)) * x) * x + np.float32(1)
    far = ((np.float32(-0.5) * x + np.float32(2.5)) * x - np.float32(4)) * x + np.float32(2)
    return np.where(x >= 2, np.float32(0), np.where(x >= 1, far, near))


def _spans(in_size, out_size, interpolation):
    """`(starts, weights)` of one axis as TensorFlow's antialiased `ScaleAndTranslate`
    computes them: each output pixel's first input pixel and its normalised kernel
    weights (`(out_size, span)` float32, zero past the image)."""
    radius = np.float32(1 if interpolation == "bilinear" else 2)
    inv_scale = np.float32(1.0 / float(np.float32(out_size) / np.float32(in_size)))
    kernel_scale = max(inv_scale, np.float32(1))
    span = min(2 * int(np.ceil(radius * kernel_scale)) + 1, in_size)
    sample = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * inv_scale
    start = np.ceil(sample - radius * kernel_scale - np.float32(0.5)).astype(np.int64)
    end = np.floor(sample + radius * kernel_scale - np.float32(0.5)).astype(np.int64)
    start = np.clip(start, 0, in_size - 1)
    end = np.clip(end, 0, in_size - 1) + 1
    source = start[:, None] + np.arange(span)
    position = source.astype(np.float32) + np.float32(0.5) - sample[:, None]
    weights = _kernel(interpolation, position * (np.float32(1) / kernel_scale))
    weights = np.where(source < end[:, None], weights, np.float32(0)).astype(np.float32)
    total = np.zeros(out_size, np.float32)
    for k in range(span):  # summed in order, in float32
        total = total + weights[:, k]
    weights = weights * (np.float32(1) / total)[:, None]
    return start, weights


def _gather(pixels, spans, axis):
    """`pixels` resampled along `axis` by `spans`, each sum taken in span order."""
    start, weights = spans
    pixels = np.ascontiguousarray(np.moveaxis(pixels, axis, 0))  # whole rows to gather
    out = np.zeros((len(start), *pixels.shape[1:]), np.float32)
    last = pixels.shape[0] - 1
    for k in range(weights.shape[1]):
        out += pixels[np.minimum(start + k, last)] * weights[:, k, None, None]
    return np.moveaxis(out, 0, axis)


def eval_resize(image, size, crop_fraction=None, preprocessing=None):
    """One uint8 image brought to the model's `size` as float32, as
    `keras_vit.data.decode.eval_resize` brings it: the whole image resized
    (`crop_fraction=None`), else its short side resized to `size / crop_fraction` and
    the central square cut, with the filter of `preprocessing` (None: `DEFAULT`).

    Example:

    >>> eval_resize(np.zeros((48, 64, 3), np.uint8), (32, 32), 0.875).shape
    (32, 32, 3)
    """
    preprocessing = check_preprocessing(preprocessing or DEFAULT)
    method = preprocessing["interpolation"], preprocessing["antialias"]
    height, width = size
    if crop_fraction is None:
        return resize(image, size, *method)
    shape = np.array(image.shape[:2], np.float32)
    scale = np.float32(height / crop_fraction) / shape.min()
    resized = np.maximum(np.round(shape * scale).astype(np.int64), height)
    image = resize(image, tuple(resized), *method)
    top, left = (resized[0] - height) // 2, (resized[1] - width) // 2
    return image[top : top + height, left : left + width]


def read_pixels(path, channels=3):
    """The uint8 pixels `(height, width, channels)` of one image file, at its own size.

    Checked without decoding first (`headers.image_problem`: damaged files and those
    over the pixel limit are refused), then decoded (a JPEG that libjpeg decodes without
    a warning once, by `libjpeg.decode_clean`; anything else by `decode_file`: JPEG,
    PNG, GIF, BMP, WebP; the same pixels). A missing, unreadable (no permission, a
    folder), damaged or oversize file is
    an error naming it; a JPEG that decodes with a libjpeg warning is used, named in one
    logged line (`libjpeg.kept_line`).

    Example:

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "white.png")
    >>> Image.new("RGB", (30, 20), (255, 255, 255)).save(path)
    >>> read_pixels(path).shape
    (20, 30, 3)
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"No such image file: {path!r}.")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path!r} is a folder, not an image file.")
    try:
        with open(path, "rb") as file:
            payload = file.read()
    except OSError as error:  # no read permission, an I/O error
        raise OSError(f"{path!r} cannot be read: {error.strerror or error}.") from None
    problem = headers.image_problem(payload)
    if problem:
        raise ValueError(f"{path!r} is not a readable image: {problem}.")
    image = libjpeg.decode_clean(payload, channels) if channels in (1, 3) else None
    if image is None:  # not a clean JPEG: PIL, and libjpeg's warning if any
        try:
            image = decode_file(payload, channels)
        except ValueError as error:
            raise ValueError(f"{path!r} is not a readable image: {error}") from None
        warning = libjpeg.message(payload)
        if warning:
            logger.warning(libjpeg.kept_line(path, warning))
    return image


def read_images(paths, image_size, *, channels=3, crop_fraction=None, preprocessing=None):
    """Image files as one batch of model inputs, `(len(paths), size, size, channels)`.

    Each file is read by `read_pixels` (checked, decoded; errors name the file),
    brought to `image_size` by `eval_resize` (the whole image, or a run's central
    crop) with the resize of `preprocessing` (a model's: `model_preprocessing`) and
    normalised by it (`keras_vit.preprocess`; None: scaled to [-1, 1]).

    Example:

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "white.png")
    >>> Image.new("RGB", (30, 20), (255, 255, 255)).save(path)
    >>> read_images([path], 16).shape
    (1, 16, 16, 3)
    """
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    images = [
        eval_resize(read_pixels(path, channels), size, crop_fraction, preprocessing)
        for path in paths
    ]
    return keras.ops.convert_to_numpy(preprocess(np.stack(images), preprocessing))
