"""Images of any sizes to the inputs of a NaFlex model (`keras_vit.ViT(naflex=True)`),
without TensorFlow: `naflex_inputs`, the pixels of HF's `Siglip2ImageProcessor`.

Each image is resized, its aspect kept, to the largest patch grid within the token
budget (`naflex_size`, the processor's search), by PIL's bilinear resize (the
processor's, antialiased, in 8-bit fixed point: the same pixels), normalised, cut into
patches flattened in (row, column, channel) order and padded to the budget.
"""

import dataclasses
import math
from typing import Optional

import numpy as np
from PIL import Image

from keras_vit.models.preprocessing import check_preprocessing
from keras_vit.utils.checks import check_positive_int

# SigLIP 2's: pixels to [-1, 1], PIL's bilinear resize.
SIGLIP2_PREPROCESSING = dict(mean=(0.5,) * 3, std=(0.5,) * 3, interpolation="bilinear",
                             antialias=True, crop_fraction=None)


def naflex_size(height, width, patch_size, max_num_patches):
    """The `(height, width)` in pixels an image of `height` x `width` is resized to: the
    largest scale whose sides, each rounded up to a multiple of `patch_size` (at least
    one patch), make at most `max_num_patches` patches. The scale is found by HF's
    bisection (`get_image_size_for_max_num_patches`, to 1e-5), so the sizes are its.

    Example:

    >>> naflex_size(480, 640, 16, 256)
    (224, 288)
    >>> naflex_size(10, 1000, 16, 256)
    (32, 2048)
    """

    def scaled(side, scale):
        return max(patch_size, math.ceil(side * scale / patch_size) * patch_size)

    low, high = 1e-6, 100.0
    while high - low >= 1e-5:
        scale = (low + high) / 2
        patches = scaled(height, scale) * scaled(width, scale) / patch_size**2
        if patches <= max_num_patches:
            low = scale
        else:
            high = scale
    return scaled(height, low), scaled(width, low)


def naflex_inputs(images, patch_size=16, max_num_patches=256, preprocessing=None):
    """The NaFlex inputs of a batch of images of any sizes, as HF's
    `Siglip2ImageProcessor` makes them (`pixel_values`, `pixel_attention_mask`,
    `spatial_shapes`), under the names a `keras_vit.ViT(naflex=True)` takes.

    Args:
        images: a list of `(height, width, channels)` uint8 images (1 or 3 channels),
            each of its own size.
        patch_size: the model's patch size.
        max_num_patches: the token budget: every image's patch grid holds at most
            this many patches, and every image is padded to it.
        preprocessing: the model's preprocessing dict (`model.preprocessing`; its mean
            and std normalise; its resize must be the antialiased bilinear), or None
            for SigLIP 2's (`SIGLIP2_PREPROCESSING`).

    Returns:
        A dict of NumPy arrays: `patches` `(batch, max_num_patches, P * P * channels)`
        float32, `patch_mask` `(batch, max_num_patches)` int32 (1: a real patch),
        `spatial_shapes` `(batch, 2)` int32 (each image's patch rows and columns).

    Example:

    >>> inputs = naflex_inputs([np.zeros((48, 96, 3), np.uint8)], patch_size=16,
    ...                        max_num_patches=20)
    >>> inputs["patches"].shape, inputs["spatial_shapes"].tolist(), int(inputs["patch_mask"].sum())
    ((1, 20, 768), [[3, 6]], 18)
    """
    check_positive_int("patch_size", patch_size)
    check_positive_int("max_num_patches", max_num_patches)
    preprocessing = check_preprocessing(preprocessing or SIGLIP2_PREPROCESSING)
    if (preprocessing["interpolation"], preprocessing["antialias"]) != ("bilinear", True):
        raise ValueError(
            f"naflex_inputs resizes as Siglip2ImageProcessor does (PIL's antialiased bilinear), "
            f"but the preprocessing asks for interpolation={preprocessing['interpolation']!r}, "
            f"antialias={preprocessing['antialias']}: pass a NaFlex model's preprocessing."
        )
    if isinstance(images, np.ndarray) and images.ndim == 3:
        images = [images]
    # One value when the channels share it (as `normalize`'s), so that grey images stay grey.
    mean, std = (np.asarray(preprocessing[key], np.float32) for key in ("mean", "std"))
    if len(set(mean.tolist())) == len(set(std.tolist())) == 1:
        mean, std = mean[0], std[0]
    patches, masks, shapes = [], [], []
    for index, image in enumerate(images):
        image = np.asarray(image)
        if image.ndim != 3 or image.shape[-1] not in (1, 3) or image.dtype != np.uint8:
            raise ValueError(
                f"naflex_inputs takes uint8 (height, width, 1 or 3) images, but image {index} "
                f"is {image.dtype} of shape {image.shape}: convert it with "
                "PIL.Image.open(path).convert('RGB')."
            )
        height, width = naflex_size(*image.shape[:2], patch_size, max_num_patches)
        resized = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).resize(
            (width, height), Image.Resampling.BILINEAR)
        pixels = np.asarray(resized, np.float32).reshape(height, width, image.shape[-1])
        pixels = (pixels / np.float32(255) - mean) / std
        rows, cols, channels = height // patch_size, width // patch_size, pixels.shape[-1]
        grid = pixels.reshape(rows, patch_size, cols, patch_size, channels)
        flat = grid.transpose(0, 2, 1, 3, 4).reshape(rows * cols, -1)
        padded = np.zeros((max_num_patches, flat.shape[1]), np.float32)
        padded[: rows * cols] = flat
        patches.append(padded)
        masks.append(np.arange(max_num_patches) < rows * cols)
        shapes.append((rows, cols))
    return {
        "patches": np.stack(patches),
        "patch_mask": np.stack(masks).astype(np.int32),
        "spatial_shapes": np.asarray(shapes, np.int32),
    }


@dataclasses.dataclass(frozen=True)
class NaFlexLayout:
    """The batches of a NaFlex input pipeline (`keras_vit.data.pipelines`' `naflex`):
    each image resized to the largest grid of `patch_size` patches within
    `max_num_patches`; batches padded to the smallest of `buckets` (token counts, the
    budget always one of them) holding their longest image, or with `images_per_row` K
    packed into rows of `row_tokens` tokens (default K budgets) of up to K images
    (`pack_rows`). Checked when made: `ValueError` naming a bad value.

    Example:

    >>> NaFlexLayout(16, 64, buckets=(32, 16)).buckets
    (16, 32, 64)
    >>> NaFlexLayout(16, 64, images_per_row=4).row_tokens
    256
    """

    patch_size: int
    max_num_patches: int = 256
    buckets: Optional[tuple] = None
    images_per_row: Optional[int] = None
    row_tokens: Optional[int] = None

    def __post_init__(self):
        check_positive_int("patch_size", self.patch_size)
        budget = check_positive_int("max_num_patches", self.max_num_patches)
        for bucket in self.buckets or ():
            if isinstance(bucket, bool) or not isinstance(bucket, int) or not 1 <= bucket <= budget:
                raise ValueError(
                    f"NaFlex bucket {bucket!r} must be a token count in [1, {budget}] "
                    "(the token budget per image)."
                )
        object.__setattr__(self, "buckets", tuple(sorted({*(self.buckets or ()), budget})))
        if self.images_per_row is None:
            if self.row_tokens is not None:
                raise ValueError(
                    f"row_tokens={self.row_tokens!r} needs packed rows: set images_per_row."
                )
            return
        check_positive_int("images_per_row", self.images_per_row)
        if self.row_tokens is None:
            object.__setattr__(self, "row_tokens", self.images_per_row * budget)
        check_positive_int("row_tokens", self.row_tokens)
        if self.row_tokens < budget:
            raise ValueError(
                f"row_tokens={self.row_tokens} cannot hold an image of the budget of {budget} "
                "patches: make it at least that."
            )


def pack_rows(patches, lengths, spatial_shapes, rows, row_tokens, images_per_row):
    """Images' patches packed into rows (NaViT's sequence packing), the layout of
    `keras_vit.ViT(naflex=True, images_per_row=K)`: first fit, in order, each image
    into the first row with a free slot and room for its patches; an image that fits
    in no row is left out.

    Args:
        patches: `(images, tokens, P * P * C)`: each image's patches first, then any.
        lengths: `(images,)` each image's number of patches.
        spatial_shapes: `(images, 2)` each image's patch rows and columns.
        rows: the rows of the packed batch.
        row_tokens: the tokens of each row.
        images_per_row: the slots of each row (`K`).

    Returns:
        `(inputs, index)`: the packed model inputs, a dict of `patches`
        `(rows, row_tokens, P * P * C)` float32 (each row's images one after another,
        then zeros), `patch_mask` `(rows, row_tokens)` int32 (each token's slot, 1 to K;
        0: padding) and `spatial_shapes` `(rows, K, 2)` int32 ((0, 0): an empty slot);
        and `index` `(rows, K)` int32, the image in each slot (-1: empty).

    Example:

    >>> inputs, index = pack_rows(np.ones((3, 4, 2)), [4, 2, 3], [(2, 2), (1, 2), (1, 3)],
    ...                           rows=2, row_tokens=6, images_per_row=2)
    >>> index.tolist(), inputs["patch_mask"].tolist()
    ([[0, 1], [2, -1]], [[1, 1, 1, 1, 2, 2], [1, 1, 1, 0, 0, 0]])
    """
    patches = np.asarray(patches, np.float32)
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    spatial_shapes = np.asarray(spatial_shapes, np.int32).reshape(-1, 2)
    packed = np.zeros((rows, row_tokens, patches.shape[-1]), np.float32)
    mask = np.zeros((rows, row_tokens), np.int32)
    shapes = np.zeros((rows, images_per_row, 2), np.int32)
    index = np.full((rows, images_per_row), -1, np.int32)
    used = np.zeros(rows, np.int64)
    filled = np.zeros(rows, np.int64)
    for image, length in enumerate(lengths):
        fits = np.flatnonzero((filled < images_per_row) & (used + length <= row_tokens))
        if not len(fits):
            continue
        row = fits[0]
        slot, start = filled[row], used[row]
        packed[row, start : start + length] = patches[image, :length]
        mask[row, start : start + length] = slot + 1
        shapes[row, slot] = spatial_shapes[image]
        index[row, slot] = image
        filled[row] += 1
        used[row] += length
    return {"patches": packed, "patch_mask": mask, "spatial_shapes": shapes}, index
