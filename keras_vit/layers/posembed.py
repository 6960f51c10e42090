"""Resampling position-embedding grids, for running pretrained weights at a new resolution.

Two methods, named for what they compute:

- `"bilinear_align_corners"`: vit_jax's `interpolate_posembed` (and big_vision's
  `resample_posemb`), i.e. `scipy.ndimage.zoom(grid, zoom, order=1)`; the corner
  embeddings map onto the corners.
- `"bicubic_antialias"`: timm's `resample_abs_pos_embed`, i.e.
  `torch.nn.functional.interpolate(mode="bicubic", antialias=True, align_corners=False)`,
  the Keys cubic (a = -0.5) widened by the scale factor when shrinking.
- `"bicubic"`: HF transformers' `Dinov2Model.interpolate_pos_encoding`, i.e.
  `interpolate(size=..., mode="bicubic", align_corners=False)` without antialiasing:
  torch's cubic convolution (a = -0.75) on four taps, the edge entries repeated
  beyond the grid. (The original DINOv2 code passes `scale_factor` with a 0.1 offset
  instead of `size`, which moves the taps slightly; transformers 5 does not.)
- `"bilinear_antialias"`: HF transformers' `Siglip2VisionEmbeddings` (NaFlex), i.e.
  `interpolate(mode="bilinear", antialias=True, align_corners=False)`: the triangle
  kernel widened by the scale factor when shrinking.

Each is separable, so each is a pair of `(new, old)` weight matrices applied along
the rows and the columns of the grid. The formulas are written once against an array
namespace: numpy in float64 for checkpoints (`resample_position_grid`), `keras.ops`
inside the graph of a `dynamic_image_size` model, whose input grid may be known only
when it runs (`resample_position_tensor`), and per token for a batch of images of
several grids (NaFlex: `resample_position_per_token`).
"""

import keras
import numpy as np
from keras import ops

from keras_vit.utils.checks import check_choice

INTERPOLATIONS = ("bilinear_align_corners", "bicubic_antialias", "bicubic", "bilinear_antialias")


def bilinear_align_corners_weights(size_in, size_out, xp=np, dtype="float64"):
    """The `(size_out, size_in)` weights of bilinear resampling with aligned corners.

    Written against the array namespace `xp` (numpy, or `keras.ops` for a `size_out`
    known only when the graph runs), so one formula serves checkpoint loading and
    `dynamic_image_size` models.

    Args:
        size_in: the length of the grid axis (an int).
        size_out: the new length: an int, or a scalar integer tensor with `xp=ops`.
        xp: `numpy` or `keras.ops`.
        dtype: the weights' float dtype.

    Example:

    >>> bilinear_align_corners_weights(2, 3).tolist()
    [[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]]
    """
    return _all_outputs(_bilinear_align_corners_at, size_in, size_out, xp, dtype)


def _all_outputs(weights_at, size_in, size_out, xp, dtype):
    """The `(size_out, size_in)` weights of every output entry: `weights_at` for the
    indices `0 .. size_out - 1` of an axis of length `size_out`."""
    out = xp.arange(size_out, dtype=dtype)
    return weights_at(size_in, out, out[-1:] + 1.0, xp, dtype)


# Each `_*_at(size_in, index, size_out, xp, dtype)` gives the `(..., size_in)` weights of
# output entries `index` of axes of lengths `size_out` (float arrays of one shape, or
# broadcasting): per axis of the whole grid, or per token of images of several sizes.


def _bilinear_align_corners_at(size_in, index, size_out, xp, dtype):
    # Output i samples input i * (size_in - 1) / (size_out - 1); a length of 1 on either
    # side samples the first entry, as scipy.ndimage.zoom does.
    coords = index * ((size_in - 1) / xp.maximum(size_out - 1.0, 1.0))
    taps = xp.arange(size_in, dtype=dtype)
    return xp.maximum(1.0 - xp.abs(taps - coords[..., None]), 0.0)


def _keys_cubic(x, xp, a=-0.5):
    x = xp.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return xp.where(x < 1.0, near, xp.where(x < 2.0, far, 0.0))


def _triangle(x, xp):
    return xp.maximum(1.0 - xp.abs(x), 0.0)


def _antialiased_at(kernel):
    """The weights of torch's `interpolate(antialias=True, align_corners=False)` with
    `kernel` (of support 1 or 2): output `i` is centred on input `(i + 0.5) * scale`;
    when shrinking, the kernel is stretched by the scale so that every input entry
    contributes (the antialiasing), when growing it keeps its width. Taps that fall
    outside the grid are dropped and the rest renormalised."""

    def weights_at(size_in, index, size_out, xp, dtype):
        scale = size_in / size_out
        stretch = xp.maximum(scale, 1.0)
        centers = scale * (index + 0.5)
        taps = xp.arange(size_in, dtype=dtype)
        # The kernel is zero beyond its support: every tap within the grid is a candidate.
        weights = kernel((taps - centers[..., None] + 0.5) / stretch[..., None], xp)
        return weights / xp.sum(weights, axis=-1, keepdims=True)

    return weights_at


_bicubic_antialias_at = _antialiased_at(_keys_cubic)
_bilinear_antialias_at = _antialiased_at(_triangle)


def _bicubic_at(size_in, index, size_out, xp, dtype):
    source = size_in / size_out * (index + 0.5) - 0.5
    # Every integer tap within two of a source point, from -2 to size_in + 1.
    taps = xp.arange(-2, size_in + 2, dtype=dtype)
    weights = _keys_cubic(source[..., None] - taps, xp, a=-0.75)
    if size_in == 1:
        return xp.sum(weights, axis=-1, keepdims=True)
    # torch clamps the tap indices: the taps before the grid weigh on its first entry,
    # those after it on its last.
    first = xp.sum(weights[..., :3], axis=-1, keepdims=True)
    last = xp.sum(weights[..., -3:], axis=-1, keepdims=True)
    return xp.concatenate([first, weights[..., 3:-3], last], axis=-1)


def bicubic_antialias_weights(size_in, size_out, xp=np, dtype="float64"):
    """The `(size_out, size_in)` weights of torch's bicubic resampling with
    `antialias=True, align_corners=False` (Keys cubic, a = -0.5).

    Arguments as `bilinear_align_corners_weights`.

    Example:

    >>> bicubic_antialias_weights(4, 4).tolist() == np.eye(4).tolist()
    True
    """
    return _all_outputs(_bicubic_antialias_at, size_in, size_out, xp, dtype)


def bilinear_antialias_weights(size_in, size_out, xp=np, dtype="float64"):
    """The `(size_out, size_in)` weights of torch's bilinear resampling with
    `antialias=True, align_corners=False` (the triangle kernel, stretched when
    shrinking): HF's `Siglip2VisionEmbeddings.resize_positional_embeddings`.

    Arguments as `bilinear_align_corners_weights`.

    Example:

    >>> (bilinear_antialias_weights(4, 2) * 7).tolist()
    [[3.0, 3.0, 1.0, 0.0], [0.0, 1.0, 3.0, 3.0]]
    """
    return _all_outputs(_bilinear_antialias_at, size_in, size_out, xp, dtype)


def bicubic_weights(size_in, size_out, xp=np, dtype="float64"):
    """The `(size_out, size_in)` weights of torch's bicubic resampling with
    `align_corners=False` and no antialiasing (what HF's `Dinov2Model` uses).

    Output `i` samples input `(i + 0.5) * size_in / size_out - 0.5` with the cubic
    convolution of a = -0.75 at any scale; taps beyond the grid read its edge entry.
    Arguments as `bilinear_align_corners_weights`.

    Example:

    >>> bicubic_weights(4, 4).tolist() == np.eye(4).tolist()
    True
    """
    return _all_outputs(_bicubic_at, size_in, size_out, xp, dtype)


_WEIGHTS_AT = {
    "bilinear_align_corners": _bilinear_align_corners_at,
    "bicubic_antialias": _bicubic_antialias_at,
    "bicubic": _bicubic_at,
    "bilinear_antialias": _bilinear_antialias_at,
}


def interpolation_weights(size_in, size_out, interpolation, xp=np, dtype="float64"):
    """The `(size_out, size_in)` weights of `interpolation` along one grid axis.

    Args:
        size_in, size_out, xp, dtype: as `bilinear_align_corners_weights`.
        interpolation: one of `INTERPOLATIONS`.

    Example:

    >>> interpolation_weights(3, 1, "bilinear_align_corners").tolist()
    [[1.0, 0.0, 0.0]]
    """
    check_interpolation(interpolation)
    return _all_outputs(_WEIGHTS_AT[interpolation], size_in, size_out, xp, dtype)


def _resample(grid, size, interpolation, xp, dtype):
    """`(rows, cols, D)` grid -> `(*size, D)`: the weights applied along each axis.

    Broadcast products and sums rather than matrix products, so that weights of 0
    and 1 reproduce the grid exactly also where matmuls round (TF32 on GPUs).
    """
    rows = interpolation_weights(grid.shape[0], size[0], interpolation, xp, dtype)
    cols = interpolation_weights(grid.shape[1], size[1], interpolation, xp, dtype)
    grid = xp.sum(rows[:, :, None, None] * grid[None], axis=1)
    return xp.sum(cols[None, :, :, None] * grid[:, None], axis=2)


def check_interpolation(interpolation):
    """Raises a `ValueError` unless `interpolation` is one of `INTERPOLATIONS`."""
    check_choice("interpolation", interpolation, INTERPOLATIONS)


def resample_position_grid(grid, size, interpolation="bilinear_align_corners"):
    """Resamples a `(rows, cols, ...)` grid of position embeddings to `size`.

    Args:
        grid: array whose first two axes are the patch grid, e.g. `(rows, cols, D)`.
        size: the new `(rows, cols)`; non-square grids and shrinking work too.
        interpolation: `"bilinear_align_corners"` (vit_jax, equal to
            `scipy.ndimage.zoom(order=1)`) or `"bicubic_antialias"` (timm, equal to
            torch's bicubic interpolation with `antialias=True, align_corners=False`).

    Returns:
        A numpy array of shape `(*size, ...)`, in the grid's floating dtype.

    Example:

    >>> grid = np.arange(8.0).reshape(2, 2, 2)
    >>> resample_position_grid(grid, (3, 3))[1, 1].tolist()
    [3.0, 4.0]
    """
    check_interpolation(interpolation)
    grid = np.asarray(grid)
    if grid.ndim < 2:
        raise ValueError(
            f"Expected a grid of shape (rows, cols, ...), got shape {grid.shape}."
        )
    size = tuple(size)
    if len(size) != 2 or not all(int(s) == s and s > 0 for s in size):
        raise ValueError(f"size must be (rows, cols) of positive ints, got {size!r}.")
    size = tuple(int(s) for s in size)
    dtype = grid.dtype if np.issubdtype(grid.dtype, np.floating) else np.float64
    if size == grid.shape[:2]:
        return grid.astype(dtype)
    flat = grid.astype(np.float64).reshape(*grid.shape[:2], -1)
    out = _resample(flat, size, interpolation, np, "float64")
    return out.reshape(*size, *grid.shape[2:]).astype(dtype)


def resample_position_tensor(grid, size, interpolation="bicubic_antialias"):
    """`resample_position_grid` with `keras.ops`, for a size known only at run time.

    What a `dynamic_image_size` model does with its position table: the same weights
    as `resample_position_grid`, computed in the grid's dtype.

    Args:
        grid: a `(rows, cols, D)` tensor (static `rows` and `cols`).
        size: the new `(rows, cols)`: ints or scalar integer tensors (e.g. from
            `keras.ops.shape` inside a TensorFlow graph).
        interpolation: one of `INTERPOLATIONS`.

    Returns:
        A `(*size, D)` tensor; the grid itself when `size` is statically its size.

    Example:

    >>> grid = keras.ops.reshape(keras.ops.arange(8.0), (2, 2, 2))
    >>> keras.ops.convert_to_numpy(resample_position_tensor(grid, (3, 3)))[1, 1].tolist()
    [3.0, 4.0]
    """
    check_interpolation(interpolation)
    if all(isinstance(s, int) for s in size) and tuple(size) == tuple(grid.shape[:2]):
        return grid
    dtype = keras.backend.standardize_dtype(grid.dtype)
    return _resample(grid, size, interpolation, ops, dtype)


def resample_position_per_token(grid, token_grid, interpolation="bilinear_antialias"):
    """A `(rows, cols, D)` grid resampled to each token's image grid, with `keras.ops`:
    the position of every token of a batch of images of several sizes (NaFlex).

    Token `t` of an image whose patch grid is `(h, w)`, at row `r` and column `c` of
    it, gets `sum_jk Wh[r, j] Ww[c, k] grid[j, k]`, where `Wh` and `Ww` are the weights
    of resampling the grid's rows to `h` and its columns to `w` with `interpolation`:
    row `(r, c)` of the whole grid resampled to `(h, w)`, computed for the whole padded
    batch at once (static shapes; no loop over images). Computed in float32.

    Args:
        grid: a `(rows, cols, D)` tensor.
        token_grid: `(batch, tokens, 4)`, each token's `(row, col, h, w)` in its image
            (`keras_vit.layers.naflex.NaFlexPatches`); padded tokens give any row and
            column within their `(h, w)`.
        interpolation: one of `INTERPOLATIONS`.

    Returns:
        `(batch, tokens, D)` float32 position embeddings.

    Example:

    >>> grid = keras.ops.reshape(keras.ops.arange(8.0), (2, 2, 2))
    >>> # Column 1 of a 1 x 2 image (the mean of the grid's column 1), the first of a 3 x 3.
    >>> tokens = keras.ops.convert_to_tensor([[[0, 1, 1, 2], [0, 0, 3, 3]]], "float32")
    >>> keras.ops.convert_to_numpy(resample_position_per_token(grid, tokens)).tolist()
    [[[4.0, 5.0], [0.0, 1.0]]]
    """
    check_interpolation(interpolation)
    rows, cols, width = grid.shape
    token_grid = ops.cast(token_grid, "float32")
    weights_at = _WEIGHTS_AT[interpolation]
    row_weights = weights_at(rows, token_grid[..., 0], token_grid[..., 2], ops, "float32")
    col_weights = weights_at(cols, token_grid[..., 1], token_grid[..., 3], ops, "float32")
    # The outer product of each token's two weight rows, applied to the flattened grid:
    # one matrix product for the batch.
    weights = row_weights[..., :, None] * col_weights[..., None, :]
    shape = ops.shape(weights)
    weights = ops.reshape(weights, (shape[0], shape[1], rows * cols))
    flat = ops.reshape(ops.cast(grid, "float32"), (rows * cols, width))
    return ops.matmul(weights, flat)
