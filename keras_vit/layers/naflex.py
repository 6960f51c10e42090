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

A packed NaFlex model (`ViT(naflex=True, images_per_row=K)`, NaViT's packing, Dehghani
et al. 2023) takes several images per row: `patch_mask` holds each token's slot (k in
1..K for the row's k-th image, 0 for padding) and `spatial_shapes` `(batch, K, 2)` each
slot's grid ((0, 0) for an empty slot). `PackedNaFlexPatches` places each token in its
own slot's image, `SlotPrefix` and `PackSlots` put each slot's prefix tokens in front,
slot after slot, `TokenMask(images_per_row=K)` gives the slot of every token of the
sequence, and `SlotMasks` the masks that keep each image to its own tokens in attention
and pooling.
"""

import keras
from keras import ops

from keras_vit.utils.checks import check_positive_int
from keras_vit.utils.serialization import serializable

# What a padded key adds to its attention logits: its softmax weight is exactly 0 in
# float32 (finite, so that a logit minus the row's maximum is never inf - inf).
MASKED_LOGIT = -1e30


def mask_bias(mask):
    """The float32 bias that adds `MASKED_LOGIT` to the attention logits where `mask` is
    0: `(batch, 1, 1, tokens)` for a mask of keys `(batch, tokens)` (every query alike),
    `(batch, 1, queries, tokens)` for a mask of query-key pairs `(batch, queries,
    tokens)` (a packed row's `SlotMasks`).

    Example:

    >>> bias = mask_bias(keras.ops.convert_to_tensor([[1.0, 0.0]]))
    >>> tuple(bias.shape), keras.ops.convert_to_numpy(bias).reshape(-1) < -1e29
    ((1, 1, 1, 2), array([False,  True]))
    >>> tuple(mask_bias(keras.ops.ones((1, 3, 2))).shape)
    (1, 1, 3, 2)
    """
    mask = ops.cast(mask, "float32")
    bias = (1.0 - mask) * MASKED_LOGIT
    return bias[:, None, None, :] if len(mask.shape) == 2 else bias[:, None]


def masked_mean(tokens, mask):
    """The mean of `tokens` `(batch, n, D)` over those whose `mask` `(batch, n)` is 1;
    with a mask of rows `(batch, K, n)` (a packed row's slots), the mean of each row's
    tokens, `(batch, K, D)`, 0 for a row without any.

    Example:

    >>> tokens = keras.ops.convert_to_tensor([[[1.0], [3.0], [100.0]]])
    >>> mask = keras.ops.convert_to_tensor([[1.0, 1.0, 0.0]])
    >>> keras.ops.convert_to_numpy(masked_mean(tokens, mask)).tolist()
    [[2.0]]
    >>> rows = keras.ops.convert_to_tensor([[[1.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]])
    >>> keras.ops.convert_to_numpy(masked_mean(tokens, rows)).tolist()
    [[[2.0], [100.0], [0.0]]]
    """
    if None not in (tokens.shape[1], mask.shape[-1]) and tokens.shape[1] != mask.shape[-1]:
        raise ValueError(
            f"masked_mean needs a mask of one entry per token, got {mask.shape[-1]} for "
            f"{tokens.shape[1]} tokens."
        )
    mask = ops.cast(mask, tokens.dtype)
    if len(mask.shape) == 3:
        counts = ops.sum(mask, axis=-1, keepdims=True)
        return ops.matmul(mask, tokens) / ops.maximum(counts, ops.cast(1, tokens.dtype))
    mask = mask[..., None]
    return ops.sum(tokens * mask, axis=1) / ops.sum(mask, axis=1)


def nth_of_rows(tokens, rows, n):
    """The `n`-th token (from 0, in sequence order) of each row of a mask of rows:
    `tokens` `(batch, T, D)`, `rows` `(batch, K, T)` (1 where a token is the row's) ->
    `(batch, K, D)`; a row of fewer tokens gives the sequence's last token.

    Example:

    >>> tokens = keras.ops.reshape(keras.ops.arange(4.0), (1, 4, 1))
    >>> rows = keras.ops.convert_to_tensor([[[0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0]]])
    >>> keras.ops.convert_to_numpy(nth_of_rows(tokens, rows, 1)).reshape(-1).tolist()
    [3.0, 2.0]
    """
    # The n-th member is the first token where the row's running count reaches n + 1:
    # its index is how many tokens come before that.
    counts = ops.cumsum(ops.cast(rows, "float32"), axis=-1)
    index = ops.sum(ops.cast(counts < n + 1, "int32"), axis=-1)
    index = ops.minimum(index, ops.shape(tokens)[1] - 1)
    shape = (ops.shape(tokens)[0], ops.shape(index)[1], tokens.shape[-1])
    return ops.take_along_axis(tokens, ops.broadcast_to(index[..., None], shape), axis=1)


def after_first(rows, n):
    """A mask of rows `(batch, K, T)` without the first `n` tokens of each row.

    Example:

    >>> rows = keras.ops.convert_to_tensor([[[1.0, 0.0, 1.0, 1.0]]])
    >>> keras.ops.convert_to_numpy(after_first(rows, 1)).tolist()
    [[[0.0, 0.0, 1.0, 1.0]]]
    """
    rows = ops.cast(rows, "float32")
    return rows * ops.cast(ops.cumsum(rows, axis=-1) > n, "float32")


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

    With `images_per_row` K (a packed row), the mask is each token's slot: the
    `num_prefix` tokens of slot 1, then those of slot 2, ..., each taking its slot's
    number, then the patch mask (the patches' slots, 0 for padding). Without it the row
    is one slot: the same numbers.

    Args:
        num_prefix: the tokens in front of each slot's patches.
        images_per_row: the slots K of a packed row, or None (one image per row).

    Returns:
        `(batch, images_per_row * num_prefix + tokens)` float32.

    Example:

    >>> mask = TokenMask(num_prefix=2)(keras.ops.convert_to_tensor([[1, 0]]))
    >>> keras.ops.convert_to_numpy(mask).tolist()
    [[1.0, 1.0, 1.0, 0.0]]
    >>> slots = TokenMask(1, images_per_row=2)(keras.ops.convert_to_tensor([[1, 2, 2, 0]]))
    >>> keras.ops.convert_to_numpy(slots).tolist()
    [[1.0, 2.0, 1.0, 2.0, 2.0, 0.0]]
    """

    def __init__(self, num_prefix=0, images_per_row=None, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix = int(num_prefix)
        if self.num_prefix < 0:
            raise ValueError(f"num_prefix must be 0 or more, got {num_prefix!r}.")
        self.images_per_row = check_positive_int("images_per_row", images_per_row, optional=True)

    @property
    def _slots(self):
        return self.images_per_row or 1

    def call(self, patch_mask):
        mask = ops.cast(patch_mask, "float32")
        if not self.num_prefix:
            return mask
        # Slot k's prefix tokens take k, slot after slot.
        # Broadcast, not ops.repeat: PyTorch's repeat_interleave breaks torch.compile's graph.
        slots = ops.arange(1, self._slots + 1, dtype="float32")[:, None]
        numbers = ops.reshape(ops.broadcast_to(slots, (self._slots, self.num_prefix)), (-1,))
        prefix = ops.broadcast_to(numbers[None], (ops.shape(mask)[0], self._slots * self.num_prefix))
        return ops.concatenate([prefix, mask], axis=1)

    def compute_output_spec(self, patch_mask):
        length = patch_mask.shape[1]
        prefix = self._slots * self.num_prefix
        return keras.KerasTensor(
            (patch_mask.shape[0], None if length is None else length + prefix), "float32"
        )

    def get_config(self):
        packed = {} if self.images_per_row is None else {"images_per_row": self.images_per_row}
        return {**super().get_config(), "num_prefix": self.num_prefix, **packed}


def packed_token_grid(patch_mask, spatial_shapes):
    """Each token's `(row, col, rows, cols)` in its own slot's image, in a packed row.

    A token's place is its index among the tokens of its slot (in sequence order),
    read row-major in the slot's `(rows, cols)` grid: what `NaFlexPatches` gives an
    unpacked row's tokens. Padding (slot 0) takes row and column 0 of a 1 x 1 grid, so
    that every position it gets is finite. Static shapes, no loop over images.

    Args:
        patch_mask: `(batch, T)` each token's slot, 1..K, 0 for padding.
        spatial_shapes: `(batch, K, 2)` each slot's patch rows and columns.

    Returns:
        `(batch, T, 4)` float32.

    Example:

    >>> mask = keras.ops.convert_to_tensor([[1, 1, 2, 2, 2, 0]])
    >>> shapes = keras.ops.convert_to_tensor([[[1, 2], [3, 1]]])
    >>> keras.ops.convert_to_numpy(packed_token_grid(mask, shapes))[0].tolist()
    [[0.0, 0.0, 1.0, 2.0], [0.0, 1.0, 1.0, 2.0], [0.0, 0.0, 3.0, 1.0], [1.0, 0.0, 3.0, 1.0], [2.0, 0.0, 3.0, 1.0], [0.0, 0.0, 1.0, 1.0]]
    """
    slots = spatial_shapes.shape[1]
    member = ops.one_hot(ops.cast(patch_mask, "int32"), slots + 1, dtype="float32")[..., 1:]
    # (batch, T): the token's index among its slot's tokens (0 for padding).
    index = ops.sum(member * (ops.cumsum(member, axis=1) - 1.0), axis=-1)
    # (batch, T, 2): the token's slot's grid, (1, 1) for padding.
    grid = ops.sum(member[..., None] * ops.cast(spatial_shapes, "float32")[:, None], axis=2)
    grid = ops.maximum(grid, 1.0)
    heights, widths = grid[..., 0], grid[..., 1]
    rows = ops.floor(index / widths)
    cols = index - rows * widths
    return ops.stack([rows, cols, heights, widths], axis=-1)


@serializable
class PackedNaFlexPatches(NaFlexPatches):
    """The patches of a packed NaFlex row (several images per row), and each token's
    place in its own slot's image.

    `call(patches, spatial_shapes, patch_mask)` returns `(patches, token_grid)` as
    `NaFlexPatches`, the token grid from `packed_token_grid`: `spatial_shapes` is
    `(batch, images_per_row, 2)` and `patch_mask` each token's slot.

    Args:
        patch_size: the side P of a patch, in pixels.
        images_per_row: the slots K of a row.
        channels: the image channels C.

    Example:

    >>> layer = PackedNaFlexPatches(2, images_per_row=2, channels=1)
    >>> shapes = keras.ops.convert_to_tensor([[[1, 2], [1, 1]]])
    >>> mask = keras.ops.convert_to_tensor([[1, 1, 2, 0]])
    >>> _, grid = layer(keras.ops.zeros((1, 4, 4)), shapes, mask)
    >>> keras.ops.convert_to_numpy(grid)[0, :, :2].tolist()
    [[0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    """

    def __init__(self, patch_size, images_per_row, channels=3, **kwargs):
        super().__init__(patch_size, channels=channels, **kwargs)
        self.images_per_row = check_positive_int("images_per_row", images_per_row)

    def _check_slots(self, spatial_shapes_shape):
        shape = tuple(spatial_shapes_shape)
        if len(shape) != 3 or shape[1:] not in ((self.images_per_row, 2), (None, 2)):
            raise ValueError(
                f"A row of images_per_row={self.images_per_row} images takes spatial_shapes "
                f"of shape (batch, {self.images_per_row}, 2), got {shape}: give each slot's "
                "patch rows and columns, (0, 0) for an empty slot."
            )

    def build(self, patches_shape, spatial_shapes_shape=None, patch_mask_shape=None):
        super().build(patches_shape, spatial_shapes_shape)
        if spatial_shapes_shape is not None:
            self._check_slots(spatial_shapes_shape)

    def call(self, patches, spatial_shapes, patch_mask):
        self._check_slots(spatial_shapes.shape)
        return patches, packed_token_grid(patch_mask, spatial_shapes)

    def compute_output_spec(self, patches, spatial_shapes, patch_mask=None):
        return super().compute_output_spec(patches, spatial_shapes)

    def get_config(self):
        return {**super().get_config(), "images_per_row": self.images_per_row}


@serializable
class SlotPrefix(keras.layers.Layer):
    """The empty prefix of each slot of a packed row, `(batch, images_per_row, 0, D)`
    from the row's tokens `(batch, T, D)`: what the `ClassToken` layers prepend their
    tokens to, each slot alike (then `PackSlots` puts them in front of the patches).

    Args:
        images_per_row: the slots K of a row.

    Example:

    >>> tuple(SlotPrefix(3)(keras.ops.zeros((2, 5, 8))).shape)
    (2, 3, 0, 8)
    """

    def __init__(self, images_per_row, **kwargs):
        super().__init__(**kwargs)
        self.images_per_row = check_positive_int("images_per_row", images_per_row)

    def call(self, tokens):
        shape = (ops.shape(tokens)[0], self.images_per_row, 0, tokens.shape[-1])
        return ops.zeros(shape, tokens.dtype)

    def compute_output_shape(self, tokens_shape):
        return (tokens_shape[0], self.images_per_row, 0, tokens_shape[-1])

    def get_config(self):
        return {**super().get_config(), "images_per_row": self.images_per_row}


@serializable
class PackSlots(keras.layers.Layer):
    """A packed row's sequence: each slot's prefix tokens `(batch, K, P, D)`, slot after
    slot, in front of the row's patch tokens `(batch, T, D)`: `(batch, K * P + T, D)`.

    Example:

    >>> prefix = keras.ops.reshape(keras.ops.arange(4.0), (1, 2, 2, 1))
    >>> tokens = PackSlots()(prefix, keras.ops.full((1, 1, 1), 9.0))
    >>> keras.ops.convert_to_numpy(tokens).reshape(-1).tolist()
    [0.0, 1.0, 2.0, 3.0, 9.0]
    """

    def call(self, prefix, tokens):
        slots, count, width = prefix.shape[1:]
        flat = ops.reshape(prefix, (ops.shape(prefix)[0], slots * count, width))
        return ops.concatenate([ops.cast(flat, tokens.dtype), tokens], axis=1)

    def compute_output_shape(self, prefix_shape, tokens_shape):
        length = tokens_shape[1]
        prefix = prefix_shape[1] * prefix_shape[2]
        return (tokens_shape[0], None if length is None else prefix + length, tokens_shape[-1])


@serializable
class SlotMasks(keras.layers.Layer):
    """The masks that keep each image of a packed row to its own tokens, from the slot of
    every token of the sequence (`TokenMask(images_per_row=K)`).

    `call(slots)` returns `(pairs, rows)`: `pairs` `(batch, S, S)` float32, 1 where
    query and key are of one slot (what `mask_bias` makes the attention bias
    `(batch, 1, S, S)` of: a token attends to its own slot's tokens, prefix included;
    a padded token to the padding alone, so no real token attends to it and it to no
    real token); `rows` `(batch, K, S)` float32, row k marking slot k's tokens (what
    `TokenPooling` and `MAPHead` pool each slot over).

    Args:
        images_per_row: the slots K of a row.

    Example:

    >>> pairs, rows = SlotMasks(2)(keras.ops.convert_to_tensor([[1.0, 2.0, 1.0, 0.0]]))
    >>> keras.ops.convert_to_numpy(pairs)[0, 0].tolist(), keras.ops.convert_to_numpy(rows)[0].tolist()
    ([1.0, 0.0, 1.0, 0.0], [[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    """

    def __init__(self, images_per_row, **kwargs):
        super().__init__(**kwargs)
        self.images_per_row = check_positive_int("images_per_row", images_per_row)

    def call(self, slots):
        slots = ops.cast(slots, "float32")
        pairs = ops.cast(ops.equal(slots[:, :, None], slots[:, None, :]), "float32")
        rows = ops.one_hot(ops.cast(slots, "int32"), self.images_per_row + 1, dtype="float32")
        return pairs, ops.transpose(rows[..., 1:], (0, 2, 1))

    def compute_output_spec(self, slots):
        batch, length = slots.shape
        return (keras.KerasTensor((batch, length, length), "float32"),
                keras.KerasTensor((batch, self.images_per_row, length), "float32"))

    def get_config(self):
        return {**super().get_config(), "images_per_row": self.images_per_row}
