"""Rotary position embedding: EVA-02's table of sines and cosines (`RotaryEmbedding`), and
`rotate`, which applies any such table to queries and keys."""

import keras
from keras import ops

from keras_vit.utils.checks import check_positive_int
from keras_vit.utils.serialization import serializable


@serializable
class RotaryEmbedding(keras.layers.Layer):
    """EVA-02's 2-D rotary position embedding: the sines and cosines each attention
    rotates its patch queries and keys by (timm's `RotaryEmbeddingCat` with
    `in_pixels=False`, applied by `apply_rot_embed_cat`).

    The head width is split in two halves, one for the patch's row and one for its
    column, each with `head_dim // 4` frequencies `temperature ** (-i / (head_dim // 4))`,
    each repeated for an interleaved pair of channels. With `reference_grid`, the row
    and column indices are scaled to that grid (`index / rows * reference_rows`), as
    EVA-02 serves other image sizes than it was trained at. The tokens in front of the
    patches get no rotation: rows of sine 0 and cosine 1.

    Args:
        head_dim: the attention head width, a multiple of 4.
        grid_size: `(rows, cols)` of the patch grid when the patches come flattened.
        reference_grid: `(rows, cols)` the positions are scaled to (timm's
            `ref_feat_shape`), or None for the grid's own indices.
        num_prefix_tokens: the tokens in front of the patches (class token, ...).
        temperature: the frequency base.

    Returns:
        From the patches `(batch, rows, cols, C)` (or flattened, with `grid_size`), the
        float32 table `(prefix + rows * cols, 2 * head_dim)`: sines, then cosines. From a
        NaFlex batch's patches and token grid, `call(patches, token_grid)`, the table
        of each image's grid, `(batch, prefix + tokens, 2 * head_dim)`.

    Example:

    >>> rope = RotaryEmbedding(8, grid_size=(2, 3), num_prefix_tokens=1)
    >>> tuple(rope(keras.ops.zeros((1, 6, 12))).shape)
    (7, 16)
    """

    def __init__(self, head_dim, grid_size, reference_grid=None, num_prefix_tokens=0,
                 temperature=10000.0, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("head_dim", head_dim)
        if head_dim % 4:
            raise ValueError(
                f"rope=True needs a head width (hidden_dim / num_heads) that is a multiple "
                f"of 4, got {head_dim}: change hidden_dim or num_heads."
            )
        self.head_dim = int(head_dim)
        self.grid_size = tuple(grid_size)
        self.reference_grid = None if reference_grid is None else tuple(reference_grid)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.temperature = float(temperature)

    def call(self, patches, token_grid=None):
        if token_grid is not None:  # NaFlex: each token placed in its own image's grid
            return self._token_table(token_grid)
        if len(patches.shape) == 4:  # a dynamic model's patch grid
            rows, cols = ops.shape(patches)[1], ops.shape(patches)[2]
        else:
            rows, cols = self.grid_size
        # (size, bands) angles of the rows, then of the columns
        axes = [self.positions(size, axis)[:, None] * self._frequencies()
                for axis, size in enumerate((rows, cols))]
        # Row-major grid: the row's angles, then the column's, for each patch.
        angles = ops.concatenate([
            ops.repeat(axes[0][:, None, :], cols, axis=1),
            ops.repeat(axes[1][None, :, :], rows, axis=0),
        ], axis=-1)
        return self._with_prefix(self._sines_cosines(ops.reshape(angles, (-1, angles.shape[-1]))))

    def _frequencies(self):
        bands = self.head_dim // 4
        # arange(0, n): jax2onnx (JAX ONNX export) takes no arange(n) with stop None.
        exponents = ops.arange(0, bands, dtype="float32") / bands
        return 1.0 / ops.power(ops.cast(self.temperature, "float32"), exponents)

    def _sines_cosines(self, angles):
        """`(..., 2 * bands)` row | column angles -> `(..., 2 * head_dim)` sines | cosines,
        each angle repeated for its interleaved channel pair."""
        angles = ops.repeat(angles, 2, axis=-1)
        return ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)

    def _token_table(self, token_grid):
        """The `(batch, prefix + tokens, 2 * head_dim)` table of a NaFlex batch, from each
        token's `(row, col, rows, cols)` (`keras_vit.layers.naflex.NaFlexPatches`)."""
        token_grid = ops.cast(token_grid, "float32")
        angles = ops.concatenate([
            self.positions_at(token_grid[..., axis], token_grid[..., 2 + axis], axis)[..., None]
            * self._frequencies()
            for axis in (0, 1)
        ], axis=-1)
        return self._with_prefix(self._sines_cosines(angles))

    def _with_prefix(self, table):
        """`table` `(..., tokens, 2 * head_dim)` after the rows of the prefix tokens, which
        are not rotated (sines 0, cosines 1)."""
        shape = (*ops.shape(table)[:-2], self.num_prefix_tokens, self.head_dim)
        prefix = ops.concatenate([ops.zeros(shape), ops.ones(shape)], axis=-1)
        return ops.concatenate([prefix, table], axis=-2)

    def positions(self, size, axis):
        """The float32 positions of the `size` patches along one grid axis (`axis` 0:
        rows, 1: columns) that the frequencies multiply (`positions_at` each index)."""
        return self.positions_at(ops.arange(0, size, dtype="float32"),
                                 ops.cast(size, "float32"), axis)

    def positions_at(self, index, size, axis):
        """The float32 positions of patches at float `index` along one grid axis of
        float length `size` (`axis` 0: rows, 1: columns; tensors of one shape, or
        broadcasting): the indices, scaled to `reference_grid` when it is set. A rotary
        embedding of another family places its patches by overriding it."""
        if self.reference_grid is None:
            return index
        # timm's order: index / size * reference
        return index / size * self.reference_grid[axis]

    def compute_output_spec(self, patches, token_grid=None):
        if token_grid is not None:
            return keras.KerasTensor((patches.shape[0], None, 2 * self.head_dim), "float32")
        patches_count = None
        if len(patches.shape) != 4:
            patches_count = self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]
        return keras.KerasTensor((patches_count, 2 * self.head_dim), "float32")

    def get_config(self):
        return {
            **super().get_config(),
            "head_dim": self.head_dim,
            "grid_size": self.grid_size,
            "reference_grid": self.reference_grid,
            "num_prefix_tokens": self.num_prefix_tokens,
            "temperature": self.temperature,
        }


def rotate(x, table):
    """`x` (`(..., tokens, heads, head_dim)`) rotated by a `RotaryEmbedding` table
    (`(tokens, 2 * head_dim)`, or `(batch, tokens, 2 * head_dim)` for a NaFlex batch):
    `x * cos + rot(x) * sin`, `rot` turning each interleaved channel pair `(a, b)` into
    `(-b, a)` (timm's `apply_rot_embed_cat`)."""
    sin, cos = (ops.cast(t[..., None, :], x.dtype) for t in ops.split(table, 2, axis=-1))
    pairs = ops.reshape(x, (*ops.shape(x)[:-1], -1, 2))
    turned = ops.reshape(ops.stack([-pairs[..., 1], pairs[..., 0]], axis=-1), ops.shape(x))
    return x * cos + turned * sin
