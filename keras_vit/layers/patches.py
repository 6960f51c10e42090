"""Cutting images into patches (`Patches`), and padding them to a multiple of the patch
size first (`PadToMultiple`)."""

import keras
from keras import ops

from keras_vit.utils.checks import check_positive_int
from keras_vit.utils.serialization import serializable


@serializable
class Patches(keras.layers.Layer):
    """Cuts images into non-overlapping square patches.

    Maps `(batch, height, width, channels)` to `(batch, num_patches, P * P * channels)`.
    Patches are in row-major order and each is flattened in (row, column, channel)
    order, so a patch-embedding conv kernel of shape `(P, P, C, D)` becomes the
    projection matrix by `reshape(P * P * C, D)`.

    Args:
        patch_size: side length P of a patch, in pixels.
        flatten: False keeps the patch grid: `(batch, rows, cols, P * P * channels)`,
            what `PatchEncoder` takes from images whose size is known only at run time.

    Example:

    >>> images = keras.random.uniform((2, 32, 48, 3))
    >>> tuple(Patches(8)(images).shape), tuple(Patches(8, flatten=False)(images).shape)
    ((2, 24, 192), (2, 4, 6, 192))
    """

    def __init__(self, patch_size, flatten=True, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = check_positive_int("patch_size", patch_size)
        self.flatten = bool(flatten)

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                f"Patches expects images of shape (batch, height, width, channels), "
                f"got shape {tuple(input_shape)}."
            )
        _, height, width, channels = input_shape
        for side, size in (("height", height), ("width", width)):
            if size is not None and size % self.patch_size:
                raise ValueError(
                    f"Image {side} {size} is not divisible by patch_size {self.patch_size}: "
                    f"use an image size that is a multiple of {self.patch_size}."
                )
        self.channels = channels

    def call(self, images):
        shape = ops.shape(images)
        if images.shape[-1] != self.channels:
            raise ValueError(
                f"Expected images with {self.channels} channels (NHWC), got "
                f"{images.shape[-1]} channels in shape {tuple(images.shape)}."
            )
        p = self.patch_size
        for side, size in (("height", shape[1]), ("width", shape[2])):
            if isinstance(size, int) and size % p:
                raise ValueError(
                    f"Image {side} {size} is not divisible by patch_size {p}: use an image "
                    f"size that is a multiple of {p}, or a model built with "
                    "dynamic_image_pad=True."
                )
        rows, cols = shape[1] // p, shape[2] // p
        x = ops.reshape(images, (-1, rows, p, cols, p, self.channels))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        if self.flatten:
            return ops.reshape(x, (-1, rows * cols, p * p * self.channels))
        return ops.reshape(x, (-1, rows, cols, p * p * self.channels))

    def compute_output_shape(self, input_shape):
        batch, height, width, channels = input_shape
        p = self.patch_size
        rows = None if height is None else height // p
        cols = None if width is None else width // p
        if not self.flatten:
            return (batch, rows, cols, p * p * channels)
        return (batch, None if rows is None or cols is None else rows * cols, p * p * channels)

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size, "flatten": self.flatten}


@serializable
class PadToMultiple(keras.layers.Layer):
    """Pads images with zeros at the bottom and the right to a multiple of a size.

    As timm's `dynamic_img_pad`: a `dynamic_image_pad=True` model takes images of any
    size, and its patches cover the padded image.

    Args:
        multiple: the height and width become multiples of it (the patch size, times
            a hybrid trunk's stride).

    Example:

    >>> tuple(PadToMultiple(8)(keras.ops.ones((1, 30, 17, 3))).shape)
    (1, 32, 24, 3)
    """

    def __init__(self, multiple, **kwargs):
        super().__init__(**kwargs)
        self.multiple = check_positive_int("multiple", multiple)

    def call(self, images):
        shape = ops.shape(images)
        m = self.multiple
        pads = [(0, 0), (0, (m - shape[1] % m) % m), (0, (m - shape[2] % m) % m), (0, 0)]
        return ops.pad(images, pads)

    def compute_output_shape(self, input_shape):
        batch, height, width, channels = input_shape
        m = self.multiple
        return (batch, *(None if s is None else -(-s // m) * m for s in (height, width)), channels)

    def get_config(self):
        return {**super().get_config(), "multiple": self.multiple}
