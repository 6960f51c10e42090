"""What a trained ViT learned: attention weights, attention rollout, attention
distance, position-embedding similarity and patch-embedding filters (Dosovitskiy
et al. 2020, Fig. 6 and 7).

`attention_model` is a Keras model on any backend; the other functions are numpy
post-processing of its outputs or of the model's weights.
"""

import keras
import numpy as np

from keras_vit.layers.block import TransformerBlock
from keras_vit.layers.pooling import MAPHead
from keras_vit.utils.checks import check_choice, check_in_range
from keras_vit.models.vit import vit_parts

HEAD_FUSIONS = ("mean", "max", "min")


class _WithAttention(keras.layers.Layer):
    """Calls a `TransformerBlock` or `MAPHead` with `return_attention=True`, sharing
    its weights.

    A separate layer because a Keras functional graph expects every call of one
    layer to return the same number of outputs, and the original model calls the
    layer without attention.
    """

    def __init__(self, layer, **kwargs):
        super().__init__(name=f"{layer.name}_with_attention", **kwargs)
        self.layer = layer

    def call(self, x, training=False, **kwargs):  # kwargs: EVA-02's rotary table
        if isinstance(self.layer, MAPHead):  # no dropout to switch
            return self.layer(x, return_attention=True)
        return self.layer(x, training=training, return_attention=True, **kwargs)


def attention_model(model, pooling=False):
    """A model sharing `model`'s weights that also returns every block's attention.

    The new model maps images to `(outputs, attentions)`: `outputs` are those of
    `model` (logits, or features for a model without a head) and `attentions` is
    a list with one `(batch, heads, tokens, tokens)` float32 array per
    `TransformerBlock`, in depth order. With `pooling=True` it maps them to
    `(outputs, attentions, pooling)`, `pooling` the `(batch, heads, tokens)` float32
    attention of a `classifier="map"` model's MAP head: its probe's over the last
    block's tokens (pass it to `attention_map`). `model` itself is unchanged and
    keeps its fused-attention fast path. Any functional model containing keras-vit
    `TransformerBlock`s works.

    Args:
        model: a keras-vit model.
        pooling: also return the MAP head's attention; a model without a MAP head
            is a `ValueError`.

    Returns:
        The Keras model.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=2,
    ...                       num_heads=4, mlp_dim=64, num_classes=10)
    >>> logits, attentions = attention_model(model)(np.zeros((1, 32, 32, 3)))
    >>> len(attentions), tuple(attentions[0].shape)
    (2, (1, 4, 17, 17))
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"attention_model needs a keras-vit model, got {type(model).__name__}.")
    if not any(isinstance(layer, TransformerBlock) for layer in model.layers):
        raise ValueError(
            f"Model {model.name!r} has no TransformerBlock layers, so it has no attention "
            "weights to return."
        )
    if pooling and not any(isinstance(layer, MAPHead) for layer in model.layers):
        raise ValueError(
            f"Model {model.name!r} has no MAP head (classifier='map', pooled), so it has no "
            "pooling attention: leave pooling out and read the class token's or the mean row."
        )
    attentions, pooled = [], []

    def call_with_attention(layer, *args, **kwargs):
        if isinstance(layer, (TransformerBlock, MAPHead)):
            outputs, weights = _WithAttention(layer)(*args, **kwargs)
            (pooled if isinstance(layer, MAPHead) else attentions).append(weights)
            return outputs
        return layer(*args, **kwargs)

    try:
        rebuilt = keras.models.clone_model(
            model, clone_function=lambda layer: layer, call_function=call_with_attention
        )
    except ValueError as error:
        raise ValueError(
            f"attention_model needs a functional model such as keras_vit.ViT; "
            f"{model.name!r} could not be rebuilt: {error}"
        ) from None
    outputs = (rebuilt.output, attentions, *pooled[:1]) if pooling else (rebuilt.output, attentions)
    return keras.Model(rebuilt.input, outputs, name=f"{model.name}_attention")


def _stack_attentions(attentions):
    """Validates per-layer attention arrays and stacks them to (layers, B, H, T, T)."""
    arrays = [np.asarray(keras.ops.convert_to_numpy(a), dtype="float64") for a in attentions]
    if not arrays:
        raise ValueError("Expected at least one layer's attention weights, got none.")
    shape = arrays[0].shape
    for i, a in enumerate(arrays):
        if a.ndim != 4 or a.shape[-1] != a.shape[-2]:
            raise ValueError(
                f"Attention of layer {i} has shape {a.shape}: expected "
                "(batch, heads, tokens, tokens)."
            )
        if a.shape != shape:
            raise ValueError(
                f"Attention of layer {i} has shape {a.shape}, layer 0 has {shape}: "
                "every layer must have the same shape."
            )
    return np.stack(arrays)


def _num_prefix_tokens(tokens, grid_size, prefix_tokens=None):
    # A class token, DeiT's distillation token and registers stand before the patches;
    # without the count (a model's `ViTParts.num_prefix_tokens`), up to two are told
    # from the token count.
    rows, cols = grid_size
    if prefix_tokens is not None:
        if tokens == rows * cols + prefix_tokens:
            return prefix_tokens
        raise ValueError(
            f"{tokens} tokens do not fit grid_size {tuple(grid_size)} and prefix_tokens="
            f"{prefix_tokens}: expected {rows * cols + prefix_tokens}."
        )
    if tokens - rows * cols in (0, 1, 2):
        return tokens - rows * cols
    raise ValueError(
        f"{tokens} tokens do not fit grid_size {tuple(grid_size)}: expected "
        f"{rows * cols} patch tokens, {rows * cols + 1} with a class token, or "
        f"{rows * cols + 2} with DeiT's distillation token too."
    )


def attention_rollout(attentions, head_fusion="mean", discard_ratio=0.0):
    """Attention rollout (Abnar & Zuidema 2020): attention traced through all layers.

    Each layer's heads are fused (`"mean"` as in the paper, or `"max"` / `"min"`),
    the residual connection is accounted for by adding the identity, rows are
    renormalised to sum to 1, and the layers are multiplied in order:
    `rollout = A_L ... A_2 A_1`. Row `i` then says how much output token `i`
    draws on each input token.

    Args:
        attentions: per-layer attention weights, each `(batch, heads, T, T)`
            (the second output of `attention_model`).
        head_fusion: `"mean"`, `"max"` or `"min"` over heads.
        discard_ratio: fraction of the smallest fused weights in each row set to
            zero before the identity is added (the vit-explain heuristic that
            sharpens maps); 0 keeps them all.

    Returns:
        float64 array `(batch, T, T)`.

    Example:

    >>> uniform = np.full((1, 2, 5, 5), 0.2)
    >>> attention_rollout([uniform, uniform])[0, 0].round(3).tolist()
    [0.4, 0.15, 0.15, 0.15, 0.15]
    """
    check_choice("head_fusion", head_fusion, HEAD_FUSIONS)
    check_in_range("discard_ratio", discard_ratio, "[0, 1)")
    stacked = _stack_attentions(attentions)
    fused = getattr(np, head_fusion)(stacked, axis=2)  # (layers, B, T, T)
    tokens = fused.shape[-1]
    discard = int(discard_ratio * tokens)
    if discard:
        smallest = np.argsort(fused, axis=-1)[..., :discard]
        np.put_along_axis(fused, smallest, 0.0, axis=-1)
    fused = fused + np.eye(tokens)
    fused = fused / fused.sum(axis=-1, keepdims=True)
    rollout = np.broadcast_to(np.eye(tokens), fused.shape[1:])
    for layer in fused:
        rollout = layer @ rollout
    return rollout


def attention_map(matrix, grid_size, prefix_tokens=None, pooling=None):
    """How much each patch feeds the model's pooled output, as a `(batch, rows, cols)` map.

    For a class-token model this is the class token's row over the patch columns;
    for a `gap` model (no class token) it is the mean of all rows, since the
    pooled output averages every token; for a `map` model, given the MAP head's
    `pooling` attention (`attention_model(model, pooling=True)`), the rows weighted
    by its head-averaged probe attention, since the pooled output reads the tokens
    so (`matrix=None`: the probe's attention itself). Apply it to a rollout or to
    one layer's head-fused attention. `prefix_tokens` is how many tokens stand
    before the patches (`ViTParts.num_prefix_tokens`, needed with registers); None
    tells a class and a distillation token from the token count.

    Example:

    >>> rollout = attention_rollout([np.full((1, 1, 5, 5), 0.2)])
    >>> attention_map(rollout, (2, 2)).shape
    (1, 2, 2)
    >>> attention_map(None, (2, 2), pooling=np.full((1, 2, 4), 0.25)).shape
    (1, 2, 2)
    """
    if pooling is not None:
        pooling = np.asarray(keras.ops.convert_to_numpy(pooling), dtype="float64")
        if pooling.ndim != 3:
            raise ValueError(
                f"Expected the MAP head's (batch, heads, tokens) attention as pooling, got "
                f"shape {pooling.shape}."
            )
        probe = pooling.mean(axis=1)
        if matrix is None:
            matrix = np.broadcast_to(np.eye(probe.shape[-1]), (len(probe), *probe.shape[-1:] * 2))
    matrix = np.asarray(keras.ops.convert_to_numpy(matrix))
    if matrix.ndim != 3 or matrix.shape[-1] != matrix.shape[-2]:
        raise ValueError(f"Expected a (batch, tokens, tokens) matrix, got shape {matrix.shape}.")
    prefix = _num_prefix_tokens(matrix.shape[-1], grid_size, prefix_tokens)
    if pooling is not None:
        if probe.shape != matrix.shape[:2]:
            raise ValueError(
                f"The pooling attention has shape {pooling.shape}: expected (batch, heads, "
                f"{matrix.shape[-1]}) for the {matrix.shape} matrix."
            )
        pooled = np.einsum("bt,bts->bs", probe, matrix)[:, prefix:]
    else:
        pooled = matrix[:, 0, prefix:] if prefix else matrix.mean(axis=1)
    return pooled.reshape(-1, *grid_size)


def _patch_centre_distances(grid_size, patch_size):
    """(N, N) distances in pixels between patch centres, patches in row-major order."""
    rows, cols = np.meshgrid(np.arange(grid_size[0]), np.arange(grid_size[1]), indexing="ij")
    centres = np.stack([rows.ravel(), cols.ravel()], axis=-1) * float(patch_size)
    return np.linalg.norm(centres[:, None] - centres[None], axis=-1)


def mean_attention_distance(attentions, grid_size, patch_size, prefix_tokens=None):
    """Mean attention distance in pixels per layer and head (the paper's Fig. 7 right).

    For each patch query, the distances in image space from its patch centre to
    every patch centre, weighted by its attention weights, averaged over the
    queries and the batch. This is the paper's appendix D.7 measure at patch
    resolution: every pixel of a patch shares that patch's attention weights,
    and patches are placed at their centres. A class token has no place in the
    image, so its query row is left out and its key column dropped, with the
    remaining weights renormalised to sum to 1.

    Args:
        attentions: per-layer attention weights, each `(batch, heads, T, T)`.
        grid_size: `(rows, cols)` of the patch grid.
        patch_size: patch side in pixels.
        prefix_tokens: the tokens before the patches, as `attention_map`'s.

    Returns:
        float64 array `(layers, heads)`.

    Example:

    >>> identity = np.eye(16)[None, None]  # every patch attends to itself only
    >>> mean_attention_distance([identity], (4, 4), 8).tolist()
    [[0.0]]
    """
    stacked = _stack_attentions(attentions)
    prefix = _num_prefix_tokens(stacked.shape[-1], grid_size, prefix_tokens)
    patches = stacked[..., prefix:, prefix:]
    patches = patches / patches.sum(axis=-1, keepdims=True)
    distances = _patch_centre_distances(grid_size, patch_size)
    per_query = (patches * distances).sum(axis=-1)  # (layers, B, H, N)
    return per_query.mean(axis=(1, 3))


def patch_grid(model):
    """The `(rows, cols)` token grid of a ViT and the side of one token in input pixels.

    For a hybrid model a token covers the ResNet trunk's stride times the
    feature-map patch size.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64)
    >>> patch_grid(model)
    ((4, 4), 8)
    """
    parts = vit_parts(model)
    return parts.grid_size, parts.stride


def is_hybrid(model):
    """Whether a ViT's patches are cut from ResNet features rather than from the image.

    Example:

    >>> import keras_vit
    >>> is_hybrid(keras_vit.ViT("R+Ti/16", image_size=64, num_layers=1))
    True
    """
    return vit_parts(model).stem is not None


def position_embedding_similarity(model):
    """Cosine similarity of the patch position embeddings, `(rows, cols, rows, cols)`.

    `similarity[i, j]` is the `(rows, cols)` map of how similar patch `(i, j)`'s
    position embedding is to every other patch's: the paper's Fig. 7 (centre).
    Works for `"learned"`, `"learned2d"` and `"sincos2d"` embeddings; the class
    token's row is not part of the patch grid.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, pos_embedding="sincos2d")
    >>> round(float(position_embedding_similarity(model)[1, 2, 1, 2]), 6)
    1.0
    """
    encoder = vit_parts(model).patch_encoder
    table = encoder.position_table()
    if table is None:
        raise ValueError(
            f"Model {model.name!r} has pos_embedding={encoder.pos_embedding!r}: there are "
            "no position embeddings to compare."
        )
    table = np.asarray(keras.ops.convert_to_numpy(table), dtype="float64")[0]
    unit = table / np.linalg.norm(table, axis=-1, keepdims=True)
    similarity = unit @ unit.T
    return similarity.reshape(*encoder.grid_size, *encoder.grid_size)


def patch_embedding_components(model, n=28):
    """The first `n` principal components of the patch-embedding filters, `(n, P, P, C)`.

    The patch projection has one filter per embedding channel (a column of its
    `(P * P * C, D)` kernel, i.e. a `(P, P, C)` image patch). The filters are
    centred and decomposed by SVD; components come in order of explained
    variance, orthonormal, each shaped as an image patch: the paper's Fig. 7
    (left) shows the first 28 as RGB tiles. A component's sign is arbitrary.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64)
    >>> patch_embedding_components(model, n=4).shape
    (4, 8, 8, 3)
    """
    parts = vit_parts(model)
    if parts.stem is not None:
        raise ValueError(
            f"Model {model.name!r} is a hybrid: its patch embedding filters act on ResNet "
            "features, not on image pixels, so they have no image-patch components."
        )
    kernel = np.asarray(keras.ops.convert_to_numpy(parts.patch_embedding.kernel), dtype="float64")
    size, width = kernel.shape
    patch_size = parts.patches.patch_size
    channels = size // (patch_size * patch_size)
    if int(n) != n or not 1 <= n <= min(size, width):
        raise ValueError(
            f"n={n!r} principal components requested: expected an integer from 1 to "
            f"{min(size, width)} (the filters are {width} vectors of length {size})."
        )
    filters = kernel.T - kernel.T.mean(axis=0)
    _, _, components = np.linalg.svd(filters, full_matrices=False)
    return components[: int(n)].reshape(int(n), patch_size, patch_size, channels)
