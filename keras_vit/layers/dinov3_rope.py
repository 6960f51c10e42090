"""DINOv3's rotary position embedding: patch centres on [-1, 1], periods from a base."""

import math

from keras_vit.layers.rope import RotaryEmbedding
from keras_vit.utils.serialization import serializable


@serializable
class DINOv3RotaryEmbedding(RotaryEmbedding):
    """DINOv3's 2-D rotary position embedding (HF `DINOv3ViTRopePositionEmbedding`, timm
    `RotaryEmbeddingDinoV3`), as the sines and cosines `RotaryEmbedding` lays out.

    Each axis places its patches at their centres normalised to [-1, 1], whatever the
    grid: `2 * (index + 0.5) / size - 1` (there is no table to resample, so any image
    size runs). The angles are `2 pi * position / period`, with `head_dim // 4` periods
    `temperature ** (i / (head_dim // 4))` per axis: `RotaryEmbedding`'s frequencies
    with positions scaled by `2 pi`. The training-time coordinate augmentations (shift,
    jitter, rescale) are not applied: inference uses none.

    The table rotates interleaved channel pairs (timm's `apply_rot_embed_cat`); DINOv3's
    checkpoints rotate each channel with the one half a head away (`rotate_half`), so
    their query and key channels are reordered per head when loaded (the
    "qkv_rotate_half" conversion of `keras_vit.families.family`).

    Args:
        head_dim: the attention head width, a multiple of 4.
        grid_size: `(rows, cols)` of the patch grid when the patches come flattened.
        num_prefix_tokens: the tokens in front of the patches (class token, registers),
            which are not rotated.
        temperature: the period base (HF's `rope_theta`, 100 in every release).

    Returns:
        From the patches `(batch, rows, cols, C)` (or flattened, with `grid_size`), the
        float32 table `(prefix + rows * cols, 2 * head_dim)`: sines, then cosines.

    Example:

    >>> import keras
    >>> rope = DINOv3RotaryEmbedding(8, grid_size=(2, 3), num_prefix_tokens=5)
    >>> tuple(rope(keras.ops.zeros((1, 6, 12))).shape)
    (11, 16)
    """

    def __init__(self, head_dim, grid_size, num_prefix_tokens=0, temperature=100.0, **kwargs):
        super().__init__(head_dim, grid_size, reference_grid=None,
                         num_prefix_tokens=num_prefix_tokens, temperature=temperature, **kwargs)

    def positions_at(self, index, size, axis):
        centres = (index + 0.5) / size
        return (2.0 * centres - 1.0) * (2.0 * math.pi)

    def get_config(self):
        config = super().get_config()
        del config["reference_grid"]  # the positions are the patch centres at every size
        return config
