"""The built-in digits as NumPy arrays, without TensorFlow: scikit-learn's 8x8 digits.

The `digits:train` / `digits:test` source (`keras_vit.data.load_source`) and the GPU
training check (bench/digits_fit.py) read them from here, so both see one split.
"""

import numpy as np

SPLITS = ("train", "test")


def digits_arrays(split):
    """`(images, labels)` of one split: uint8 `(n, 8, 8, 1)` in 0-255, int32 labels 0-9.

    The split is stratified 80/20 with seed 0 (1437 train, 360 test images).

    Args:
        split: `"train"` or `"test"`.

    Returns:
        The images, grey levels 0-16 scaled to 0-255, and their labels.

    Example:

    >>> images, labels = digits_arrays("test")
    >>> images.shape, images.dtype.name, int(images.max()), labels.dtype.name
    ((360, 8, 8, 1), 'uint8', 255, 'int32')
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if split not in SPLITS:
        raise ValueError(f"The digits have splits 'train' and 'test', got {split!r}.")
    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype("uint8")[..., None]
    parts = train_test_split(
        images, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    images, labels = (parts[0], parts[2]) if split == "train" else (parts[1], parts[3])
    return images, labels.astype("int32")
