"""Patch and position embedding (`PatchEncoder`, `sincos_2d_table`) and the learned tokens
put in front of the patches (`ClassToken`: class, distillation and register tokens)."""

import keras
from keras import ops

from keras_vit.backend.calls import call_sublayer
from keras_vit.layers.dense import Dense, dense_dtypes_entry
from keras_vit.layers import posembed
from keras_vit.utils.checks import check_choice, check_positive_int
from keras_vit.utils.serialization import serializable

POSITION_EMBEDDINGS = ("learned", "learned2d", "sincos2d", "none")


def sincos_2d_embedding(rows, cols, width, temperature=10000.0):
    """The fixed 2-D sine-cosine embeddings `(..., width)` of patches at rows `rows` and
    columns `cols` (float tensors of one shape), as `sincos_2d_table` lays them out.

    Example:

    >>> rows = keras.ops.convert_to_tensor([0.0, 1.0])
    >>> tuple(sincos_2d_embedding(rows, rows, 8).shape)
    (2, 8)
    """
    if width % 4 or width < 8:
        raise ValueError(
            "pos_embedding='sincos2d' needs a width divisible by 4 and at least 8, "
            f"got hidden_dim={width}."
        )
    quarter = width // 4
    omega = 1.0 / temperature ** (ops.arange(quarter, dtype="float32") / (quarter - 1))
    y = rows[..., None] * omega
    x = cols[..., None] * omega
    return ops.concatenate([ops.sin(x), ops.cos(x), ops.sin(y), ops.cos(y)], axis=-1)


def sincos_2d_table(grid_size, width, temperature=10000.0):
    """Fixed 2-D sine-cosine position table of shape `(1, rows * cols, width)`.

    As big_vision's `posemb_sincos_2d`: frequencies `temperature ** -(i / (width/4 - 1))`,
    channels `[sin(col), cos(col), sin(row), cos(row)]`.

    Example:

    >>> table = sincos_2d_table((4, 4), 32)
    >>> tuple(table.shape)
    (1, 16, 32)
    """
    rows, cols = grid_size
    y, x = ops.meshgrid(
        ops.arange(rows, dtype="float32"), ops.arange(cols, dtype="float32"), indexing="ij"
    )
    return sincos_2d_embedding(ops.reshape(y, (-1,)), ops.reshape(x, (-1,)), width,
                               temperature)[None]


@serializable
class PatchEncoder(keras.layers.Layer):
    """Projects flattened patches to `hidden_dim` and adds position embeddings.

    It takes patches of its grid `(batch, rows * cols, features)`, or a patch grid of
    any size `(batch, rows, cols, features)` (`Patches(flatten=False)`, rows and cols
    possibly known only at run time), to which the position table is resampled in the
    graph (`position_table(grid)`): `"sincos2d"` is computed for that grid. Either way it
    returns `(batch, patches, hidden_dim)` tokens in row-major order. Given a
    `token_grid` (`call(patches, token_grid=...)`), the patches are those of a NaFlex
    batch, images of several grids padded to one token count, and each token gets the
    position of its place in its own image (`token_positions`).

    Args:
        hidden_dim: width D of the token embeddings.
        grid_size: `(rows, cols)` of the patch grid (an int means a square grid): the
            grid of the learned tables.
        pos_embedding: `"learned"` (the paper's 1-D table, default), `"learned2d"`
            (row and column tables of D/2 each, concatenated), `"sincos2d"`
            (fixed), or `"none"`.
        interpolation: how a learned table is resampled to another grid (see
            `keras_vit.layers.posembed`): `"bicubic_antialias"`, `"bilinear_align_corners"`
            or `"bicubic"`.
        dense_dtypes: `{"projection": policy}` once quantized (written
            by `get_config` after `model.quantize`); None builds it with the default policy.
        use_bias: False leaves the bias out of the patch embedding (CLIP's convolution
            has none).

    The position table covers the patches only; the class token's row lives in
    `ClassToken`, so resolution changes resample a pure patch grid.

    Example:

    >>> patches = keras.random.uniform((2, 16, 48))
    >>> tuple(PatchEncoder(32, grid_size=4)(patches).shape)
    (2, 16, 32)
    >>> tuple(PatchEncoder(32, grid_size=4)(keras.random.uniform((2, 3, 5, 48))).shape)
    (2, 15, 32)
    """

    def __init__(
        self, hidden_dim, grid_size, pos_embedding="learned", interpolation="bicubic_antialias",
        dense_dtypes=None, use_bias=True, **kwargs
    ):
        super().__init__(**kwargs)
        dense_dtypes = dense_dtypes or {}
        check_choice("pos_embedding", pos_embedding, POSITION_EMBEDDINGS)
        posembed.check_interpolation(interpolation)
        if isinstance(grid_size, int):
            grid_size = (grid_size, grid_size)
        self.hidden_dim = int(hidden_dim)
        self.grid_size = tuple(int(g) for g in grid_size)
        self.pos_embedding = pos_embedding
        self.interpolation = interpolation
        if pos_embedding == "learned2d" and self.hidden_dim % 2:
            raise ValueError(
                f"pos_embedding='learned2d' needs an even width, got hidden_dim={hidden_dim}."
            )
        if pos_embedding == "sincos2d":
            # Validates the width now rather than at the first call.
            sincos_2d_table(self.grid_size, self.hidden_dim)
        self.use_bias = bool(use_bias)
        self.projection = Dense(
            self.hidden_dim, use_bias=self.use_bias, name="projection",
            dtype=dense_dtypes.get("projection"),
        )

    def build(self, input_shape):
        rows, cols = self.grid_size
        if len(input_shape) == 3 and input_shape[1] not in (None, rows * cols):
            raise ValueError(
                f"PatchEncoder with grid_size {self.grid_size} expects {rows * cols} "
                f"patches, got {input_shape[1]}."
            )
        self.projection.build(input_shape)
        init = keras.initializers.RandomNormal(stddev=0.02)
        if self.pos_embedding == "learned":
            self.position = self.add_weight(
                name="position", shape=(1, rows * cols, self.hidden_dim), initializer=init
            )
        elif self.pos_embedding == "learned2d":
            half = self.hidden_dim // 2
            self.row_position = self.add_weight(
                name="row_position", shape=(rows, 1, half), initializer=init
            )
            self.col_position = self.add_weight(
                name="col_position", shape=(1, cols, half), initializer=init
            )

    def position_table(self, grid=None):
        """The `(1, rows * cols, hidden_dim)` table added to the patches, or None.

        Args:
            grid: `(rows, cols)` of the patches, ints or scalar integer tensors; the
                learned tables are resampled to it with `interpolation` (per axis for
                `"learned2d"`). None (or `grid_size`) gives the tables as they are.
        """
        rows, cols = self.grid_size if grid is None else grid
        if self.pos_embedding == "learned":
            if grid is None:
                return self.position
            table = ops.reshape(self.position, (*self.grid_size, self.hidden_dim))
            table = posembed.resample_position_tensor(table, (rows, cols), self.interpolation)
            return ops.reshape(table, (1, rows * cols, self.hidden_dim))
        if self.pos_embedding == "learned2d":
            half = self.hidden_dim // 2
            resample = posembed.resample_position_tensor
            row_table = resample(self.row_position, (rows, 1), self.interpolation)
            col_table = resample(self.col_position, (1, cols), self.interpolation)
            table = ops.concatenate(
                [
                    ops.broadcast_to(row_table, (rows, cols, half)),
                    ops.broadcast_to(col_table, (rows, cols, half)),
                ],
                axis=-1,
            )
            return ops.reshape(table, (1, rows * cols, self.hidden_dim))
        if self.pos_embedding == "sincos2d":
            return sincos_2d_table((rows, cols), self.hidden_dim)
        return None

    def token_positions(self, token_grid):
        """The `(batch, tokens, hidden_dim)` float32 position embeddings of the tokens of
        images of several grids (NaFlex), or None without a table.

        Args:
            token_grid: `(batch, tokens, 4)`, each token's `(row, col, rows, cols)` in
                its image (`keras_vit.layers.naflex.NaFlexPatches`). The learned table is
                resampled to each image's grid with `interpolation`, `"learned2d"`'s row
                and column tables each along their axis (NaViT's factorised
                embeddings); `"sincos2d"` is computed at each token's row and column.
        """
        if self.pos_embedding == "learned":
            table = ops.reshape(self.position, (*self.grid_size, self.hidden_dim))
            return posembed.resample_position_per_token(table, token_grid, self.interpolation)
        if self.pos_embedding == "learned2d":
            # A table of one column (rows) and one of one row (columns), each resampled
            # along its own axis: the other axis of the token grid is set to 0 of 1.
            ones, zeros = ops.ones_like(token_grid[..., :1]), ops.zeros_like(token_grid[..., :1])
            along_rows = ops.concatenate([token_grid[..., :1], zeros, token_grid[..., 2:3], ones], -1)
            along_cols = ops.concatenate([zeros, token_grid[..., 1:2], ones, token_grid[..., 3:]], -1)
            resample = posembed.resample_position_per_token
            return ops.concatenate([
                resample(self.row_position, along_rows, self.interpolation),
                resample(self.col_position, along_cols, self.interpolation),
            ], axis=-1)
        if self.pos_embedding == "sincos2d":
            return sincos_2d_embedding(token_grid[..., 0], token_grid[..., 1], self.hidden_dim)
        return None

    def call(self, patches, token_grid=None):
        x = call_sublayer(self, self.projection, patches)
        if token_grid is not None:  # NaFlex: each image its own grid
            positions = self.token_positions(token_grid)
            return x if positions is None else x + ops.cast(positions, x.dtype)
        grid = None
        if len(patches.shape) == 4:
            shape = ops.shape(patches)
            grid = (shape[1], shape[2])
            x = ops.reshape(x, (-1, grid[0] * grid[1], self.hidden_dim))
        table = self.position_table(grid)
        if table is None:
            return x
        return x + ops.cast(table, x.dtype)

    def compute_output_shape(self, patches_shape, token_grid_shape=None):
        if len(patches_shape) == 4:
            batch, rows, cols = patches_shape[:3]
            return (batch, None if rows is None or cols is None else rows * cols, self.hidden_dim)
        return (*patches_shape[:-1], self.hidden_dim)

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_dim": self.hidden_dim,
            "grid_size": self.grid_size,
            "pos_embedding": self.pos_embedding,
            "interpolation": self.interpolation,
            **dense_dtypes_entry(self, ("projection",)),
            # Only when off: the configs of the models with a bias stay as they were.
            **({} if self.use_bias else {"use_bias": False}),
        }


@serializable
class ClassToken(keras.layers.Layer):
    """Prepends a learned class token (zero-initialised) to a token sequence.

    It prepends along the tokens axis, the last but one: given `(batch, K, tokens, D)`
    (a packed NaFlex row's K slots, `keras_vit.layers.naflex.SlotPrefix`), each slot
    gets the same tokens, one set of variables.

    Args:
        use_position: also learn the class token's own position-embedding row
            (initialised like the position table). The official checkpoints'
            position table has this row as its first; storing it here keeps the
            exact parameter count while the patch table stays a pure grid.
        num_tokens: how many learned tokens it prepends (1; DINOv2's registers: 4).

    Example:

    >>> tokens = keras.random.uniform((2, 16, 32))
    >>> tuple(ClassToken()(tokens).shape), tuple(ClassToken(num_tokens=4)(tokens).shape)
    ((2, 17, 32), (2, 20, 32))
    >>> tuple(ClassToken(num_tokens=4)(keras.ops.zeros((2, 3, 0, 32))).shape)
    (2, 3, 4, 32)
    """

    def __init__(self, use_position=False, num_tokens=1, **kwargs):
        super().__init__(**kwargs)
        self.use_position = bool(use_position)
        self.num_tokens = check_positive_int("num_tokens", num_tokens)

    def build(self, input_shape):
        width = input_shape[-1]
        shape = (1, self.num_tokens, width)
        self.token = self.add_weight(name="token", shape=shape, initializer="zeros")
        if self.use_position:
            self.position = self.add_weight(
                name="position",
                shape=shape,
                initializer=keras.initializers.RandomNormal(stddev=0.02),
            )

    def call(self, tokens):
        token = self.token + self.position if self.use_position else self.token
        token = ops.cast(token, tokens.dtype)
        token = ops.broadcast_to(
            token, (*ops.shape(tokens)[:-2], self.num_tokens, tokens.shape[-1])
        )
        return ops.concatenate([token, tokens], axis=len(tokens.shape) - 2)

    def compute_output_shape(self, input_shape):
        *leading, length, width = input_shape
        return (*leading, None if length is None else length + self.num_tokens, width)

    def get_config(self):
        # `num_tokens` only when set: the configs of the class tokens stay as they were.
        count = {} if self.num_tokens == 1 else {"num_tokens": self.num_tokens}
        return {**super().get_config(), "use_position": self.use_position, **count}
