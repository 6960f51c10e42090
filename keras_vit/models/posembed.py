"""Resampling position-embedding grids, for running pretrained weights at a new resolution.

Two methods, named for what they compute:

- `"bilinear_align_corners"`: vit_jax's `interpolate_posembed` (and big_vision's
  `resample_posemb`), i.e. `scipy.ndimage.zoom(grid, zoom, order=1)`; the corner
  embeddings map onto the corners.
- `"bicubic_antialias"`: timm's `resample_abs_pos_embed`, i.e.
  `torch.nn.functional.interpolate(mode="bicubic", antialias=True, align_corners=False)`,
  the Keys cubic (a = -0.5) widened by the scale factor when shrinking.

Both are separable, so each is a pair of `(new, old)` weight matrices applied along
the rows and the columns of the grid, computed here with numpy in float64.
"""

import numpy as np

from keras_vit.utils.checks import check_choice

INTERPOLATIONS = ("bilinear_align_corners", "bicubic_antialias")


def _bilinear_align_corners_weights(size_in, size_out):
    weights = np.zeros((size_out, size_in))
    if size_in == 1 or size_out == 1:
        # scipy.ndimage.zoom keeps the first entry when either side has length 1.
        weights[:, 0] = 1.0
        return weights
    coords = np.arange(size_out) * ((size_in - 1) / (size_out - 1))
    low = np.minimum(np.floor(coords).astype(int), size_in - 2)
    frac = coords - low
    rows = np.arange(size_out)
    weights[rows, low] = 1.0 - frac
    weights[rows, low + 1] = frac
    return weights


def _keys_cubic(x, a=-0.5):
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _bicubic_antialias_weights(size_in, size_out):
    scale = size_in / size_out
    # When shrinking, the kernel is stretched by the scale so that every input
    # entry contributes (the antialiasing); when growing it keeps its width.
    stretch = max(scale, 1.0)
    support = 2.0 * stretch
    weights = np.zeros((size_out, size_in))
    for out in range(size_out):
        center = scale * (out + 0.5)
        first = max(int(np.floor(center - support + 0.5)), 0)
        stop = min(int(np.floor(center + support + 0.5)), size_in)
        taps = _keys_cubic((np.arange(first, stop) - center + 0.5) / stretch)
        # Taps that fall outside the grid are dropped and the rest renormalised.
        weights[out, first:stop] = taps / taps.sum()
    return weights


_WEIGHTS = {
    "bilinear_align_corners": _bilinear_align_corners_weights,
    "bicubic_antialias": _bicubic_antialias_weights,
}


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
    weights = _WEIGHTS[interpolation]
    rows = weights(grid.shape[0], size[0])
    cols = weights(grid.shape[1], size[1])
    out = np.tensordot(rows, grid.astype(np.float64), axes=(1, 0))
    out = np.moveaxis(np.tensordot(cols, out, axes=(1, 1)), 0, 1)
    return out.astype(dtype)
