"""FlexiViT patch-size resampling: one patch embedding serving several patch sizes.

Beyer et al. 2023 ("FlexiViT"; big_vision `models/proj/flexi/vit.py`,
`resample_patchemb`): a kernel `w` for `p x p` patches becomes the kernel `w'` for
`q x q` patches that solves `B^T w' = w` in the least-squares sense (the
pseudo-inverse), where `B` resizes a `p x p` patch to `q x q` bilinearly. Then
`<resize(x), w'> = <x, w>`: a patch resized to the new size embeds as the original
patch did, exactly (up to float error) when the patch grows. Computed with numpy.
"""

import numpy as np


def _bilinear_weights(size_in, size_out):
    """`(size_out, size_in)` weights of TensorFlow's bilinear resize (half-pixel
    centres, no antialiasing: `tf.image.resize(method="bilinear")`, big_vision's)."""
    weights = np.zeros((size_out, size_in))
    coords = (np.arange(size_out) + 0.5) * (size_in / size_out) - 0.5
    low = np.floor(coords)
    frac = coords - low
    low = low.astype(int)
    rows = np.arange(size_out)
    np.add.at(weights, (rows, np.clip(low, 0, size_in - 1)), 1.0 - frac)
    np.add.at(weights, (rows, np.clip(low + 1, 0, size_in - 1)), frac)
    return weights


def resample_patch_embedding(kernel, new_patch_size):
    """Resamples a patch-embedding kernel `(p, p, channels, width)` to a new patch size.

    Args:
        kernel: the `(height, width, channels, hidden)` kernel (as the official
            `embedding/kernel`; a keras-vit projection kernel reshaped to it).
        new_patch_size: int or `(height, width)` of the new patches.

    Returns:
        A float numpy array `(*new_patch_size, channels, hidden)`, in the kernel's dtype.

    Example:

    >>> kernel = np.random.default_rng(0).normal(size=(16, 16, 3, 8))
    >>> resample_patch_embedding(kernel, 8).shape
    (8, 8, 3, 8)
    """
    kernel = np.asarray(kernel)
    if kernel.ndim != 4:
        raise ValueError(
            f"Expected a patch-embedding kernel of shape (height, width, channels, "
            f"hidden), got shape {kernel.shape}."
        )
    size = (new_patch_size,) * 2 if np.ndim(new_patch_size) == 0 else tuple(new_patch_size)
    if len(size) != 2 or not all(int(s) == s and s > 0 for s in size):
        raise ValueError(
            f"new_patch_size must be a positive int or (height, width), got {new_patch_size!r}."
        )
    size = tuple(int(s) for s in size)
    dtype = kernel.dtype if np.issubdtype(kernel.dtype, np.floating) else np.float64
    if size == kernel.shape[:2]:
        return kernel.astype(dtype)
    # resize(x) = B x for a row-major flattened patch x; separable, so B = Wr (x) Wc.
    resize = np.kron(
        _bilinear_weights(kernel.shape[0], size[0]), _bilinear_weights(kernel.shape[1], size[1])
    )
    flat = kernel.astype(np.float64).reshape(-1, *kernel.shape[2:])
    new = np.tensordot(np.linalg.pinv(resize.T), flat, axes=(1, 0))
    return new.reshape(*size, *kernel.shape[2:]).astype(dtype)
