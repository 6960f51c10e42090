"""Native-resolution (NaFlex) inputs: images of several sizes in one batch, each already
cut into its own patch grid and padded to one token count.

A NaFlex model takes the dict HF's `Siglip2ImageProcessor` makes
(`keras_vit.naflex_inputs`): `patches` `(batch, tokens, P * P * C)`, each image's
patches in row-major order, then zeros; `patch_mask` `(batch, tokens)`, 1 for a real
patch, 0 for padding; `spatial_shapes` `(batch, 2)`, each image's patch rows and
columns. `NaFlexPatches` reads each token's place in its image from them (what the
position embeddings take), `TokenMask` extends the mask over the tokens in front of the
patches, and `mask_bias` turns it into the additive attention bias that keeps padded
tokens out of every attention.
"""

import keras
from keras import ops

from keras_vit.utils.checks import check_positive_int
from keras_vit.utils.serialization import serializable

# What a padded key adds to its attention logits: its softmax weight is exactly 0 in
# float32 (finite, so that a logit minus the row's maximum is never inf - inf).
MASKED_LOGIT = -1e30


def mask_bias(mask):
    """The float32 `(batch, 1, 1, tokens)` bias that adds `MASKED_LOGIT` to the attention
    logits of the keys whose `mask` `(batch, tokens)` is 0.

    Example:

    >>> bias = mask_bias(keras.ops.convert_to_tensor([[1.0, 0.0]]))
    >>> tuple(bias.shape), keras.ops.convert_to_numpy(bias).reshape(-1) < -1e29
    ((1, 1, 1, 2), array([False,  True]))
    """
    mask = ops.cast(mask, "float32")
    return ((1.0 - mask) * MASKED_LOGIT)[:, None, None, :]


def masked_mean(tokens, mask):
    """The mean of `tokens` `(batch, n, D)` over those whose `mask` `(batch, n)` is 1.

    Example:

    >>> tokens = keras.ops.convert_to_tensor([[[1.0], [3.0], [100.0]]])
    >>> mask = keras.ops.convert_to_tensor([[1.0, 1.0, 0.0]])
    >>> keras.ops.convert_to_numpy(masked_mean(tokens, mask)).tolist()
    [[2.0]]
    """
    if None not in (tokens.shape[1], mask.shape[1]) and tokens.shape[1] != mask.shape[1]:
        raise ValueError(
            f"masked_mean needs a mask of one entry per token, got {mask.shape[1]} for "
            f"{tokens.shape[1]} tokens."
        )
    mask = ops.cast(mask, tokens.dtype)[..., None]
    return ops.sum(tokens * mask, axis=1) / ops.sum(mask, axis=1)


@serializable
class NaFlexPatches(keras.layers.Layer):
    """The patches of a NaFlex input, and each token's place in its image.

    `call(patches, spatial_shapes)` returns `(patches, token_grid)`: the patches as they
    are, checked to be `P * P * channels` wide, and `token_grid` `(batch, tokens, 4)`
    float32, each token's `(row, col, rows, cols)`: its row and column in its image's
    patch grid and that grid's size. Padded tokens take row and column 0 (as HF's
    `resize_positional_embeddings`), so that every position they get is finite.

    Args:
        patch_size: the side P of a patch, in pixels.
        channels: the image channels C.

    Example:

    >>> layer = NaFlexPatches(2, channels=1)
    >>> patches = keras.ops.zeros((1, 4, 4))
    >>> _, grid = layer(patches, keras.ops.convert_to_tensor([[1, 3]]))
    >>> keras.ops.convert_to_numpy(grid)[0].tolist()
    [[0.0, 0.0, 1.0, 3.0], [0.0, 1.0, 1.0, 3.0], [0.0, 2.0, 1.0, 3.0], [0.0, 0.0, 1.0, 3.0]]
    """

    def __init__(self, patch_size, channels=3, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = check_positive_int("patch_size", patch_size)
        self.channels = check_positive_int("channels", channels)
        # The patches come flattened (as `Patches(flatten=True)` gives them).
        self.flatten = True

    def build(self, patches_shape, spatial_shapes_shape=None):
        width = self.patch_size**2 * self.channels
        if patches_shape[-1] != width:
            raise ValueError(
                f"NaFlex patches of {self.patch_size}x{self.patch_size} pixels and "
                f"{self.channels} channels are {width} values wide, got shape "
                f"{tuple(patches_shape)}: make them with keras_vit.naflex_inputs(images, "
                f"patch_size={self.patch_size})."
            )

    def call(self, patches, spatial_shapes):
        shapes = ops.cast(spatial_shapes, "float32")
        heights, widths = shapes[:, None, 0], shapes[:, None, 1]
        index = ops.arange(ops.shape(patches)[1], dtype="float32")[None, :]
        rows = ops.floor(index / widths)
        cols = index - rows * widths
        valid = ops.cast(index < heights * widths, "float32")
        heights, widths = heights + 0.0 * index, widths + 0.0 * index  # one per token
        token_grid = ops.stack([rows * valid, cols * valid, heights, widths], axis=-1)
        return patches, token_grid

    def compute_output_spec(self, patches, spatial_shapes):
        grid = keras.KerasTensor((*patches.shape[:2], 4), "float32")
        return keras.KerasTensor(patches.shape, self.compute_dtype), grid

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size, "channels": self.channels}


@serializable
class TokenMask(keras.layers.Layer):
    """The float32 mask of the whole token sequence: 1 for each of the `num_prefix`
    tokens in front of the patches (class, distillation, register tokens: never
    padding), then the patch mask.

    Example:

    >>> mask = TokenMask(num_prefix=2)(keras.ops.convert_to_tensor([[1, 0]]))
    >>> keras.ops.convert_to_numpy(mask).tolist()
    [[1.0, 1.0, 1.0, 0.0]]
    """

    def __init__(self, num_prefix=0, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix = int(num_prefix)
        if self.num_prefix < 0:
            raise ValueError(f"num_prefix must be 0 or more, got {num_prefix!r}.")

    def call(self, patch_mask):
        mask = ops.cast(patch_mask, "float32")
        if not self.num_prefix:
            return mask
        prefix = ops.ones((ops.shape(mask)[0], self.num_prefix), "float32")
        return ops.concatenate([prefix, mask], axis=1)

    def compute_output_spec(self, patch_mask):
        length = patch_mask.shape[1]
        return keras.KerasTensor(
            (patch_mask.shape[0], None if length is None else length + self.num_prefix), "float32"
        )

    def get_config(self):
        return {**super().get_config(), "num_prefix": self.num_prefix}
