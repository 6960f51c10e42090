"""Intermediate features of a ViT: the tokens after chosen blocks, for dense heads.

`feature_model` is keras-vit's counterpart of timm's `forward_intermediates` and
DINO's `get_intermediate_layers`: a Keras model from images to the token features
after some blocks, as feature maps `(batch, rows, cols, width)` or as token sequences.
"""

import keras
from keras import ops

from keras_vit.utils.checks import check_choice
from keras_vit.models.vit import vit_parts

OUTPUT_FORMATS = ("NHWC", "NLC")


class _SharedLayer(keras.layers.Layer):
    """Calls another layer, sharing its weights, as a separate graph node: calling the
    layer itself on a new input would give it a second node in the model's graph."""

    def __init__(self, layer, **kwargs):
        super().__init__(**kwargs)
        self.layer = layer

    def call(self, x):
        return self.layer(x)


class _GridMaps(keras.layers.Layer):
    """Token features `(batch, rows * cols, D)` as maps `(batch, rows, cols, D)` on the
    grid of a `dynamic_image_size` model's patches `(batch, rows, cols, _)`, which is
    known only when the model runs."""

    def call(self, features, patches):
        shape = ops.shape(patches)
        return ops.reshape(features, (-1, shape[1], shape[2], features.shape[-1]))


def _block_indices(layers, depth):
    if layers is None:
        return [depth - 1]
    if isinstance(layers, int):  # the last n blocks, as timm's `indices=n`
        if not 1 <= layers <= depth:
            raise ValueError(
                f"layers={layers} asks for the last {layers} blocks of a model with "
                f"{depth}: give a count from 1 to {depth}, or a list of block indices."
            )
        return list(range(depth - layers, depth))
    indices = []
    for index in layers:
        if int(index) != index or not -depth <= index < depth:
            raise ValueError(
                f"Block index {index!r} is out of range for a model with {depth} blocks: "
                f"use 0 to {depth - 1}, or -1 to {-depth} counting from the end."
            )
        indices.append(int(index) % depth)
    if not indices:
        raise ValueError("layers is empty: give at least one block index.")
    return indices


def feature_model(model, layers=None, output_format="NHWC", norm=False, prefix_tokens=False):
    """A Keras model from `model`'s images to the token features after chosen blocks.

    It shares every weight with `model`, which is left unchanged; plain ViTs and
    hybrids alike.

    Args:
        model: a `keras_vit.ViT` (any head, pooling or position embedding); the
            maps of a `dynamic_image_size` model follow the patch grid of each input.
        layers: which blocks: None for the last, an int `n` for the last `n`, or a
            list of block indices (negative ones count from the end).
        output_format: `"NHWC"` for feature maps `(batch, rows, cols, width)` over
            the patch grid, `"NLC"` for token sequences `(batch, rows * cols, width)`
            in row-major patch order.
        norm: apply the model's final LayerNorm to each output (as its own last
            output is normalised).
        prefix_tokens: also return the tokens in front of the patches (the class
            token, DeiT's distillation token and the registers after it; none for a
            `gap` model),
            which the feature maps leave out: each output becomes a pair
            `(features, prefix)` with `prefix` of shape `(batch, prefix, width)`.

    Returns:
        A `keras.Model` with one output per chosen block, in the order given (as
        Keras does, a single output comes as itself, not in a list).

    Example:

    >>> import keras_vit
    >>> vit = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=4,
    ...                     num_heads=4, mlp_dim=64)
    >>> maps = feature_model(vit, layers=[1, -1])(keras.ops.zeros((2, 32, 32, 3)))
    >>> [tuple(m.shape) for m in maps]
    [(2, 4, 4, 32), (2, 4, 4, 32)]
    """
    check_choice("output_format", output_format, OUTPUT_FORMATS)
    parts = vit_parts(model)
    indices = _block_indices(layers, len(parts.blocks))
    rows, cols = parts.grid_size
    dynamic = not parts.patches.flatten  # a dynamic_image_size model: maps follow the input
    prefix = parts.num_prefix_tokens
    outputs = []
    for index in indices:
        tokens = parts.blocks[index].output
        if norm:
            tokens = _SharedLayer(parts.norm, name=f"norm_after_block_{index}")(tokens)
        features = tokens[:, prefix:]
        if output_format == "NHWC" and dynamic:
            features = _GridMaps(name=f"maps_after_block_{index}")(features, parts.patches.output)
        elif output_format == "NHWC":
            features = ops.reshape(features, (-1, rows, cols, features.shape[-1]))
        outputs.append((features, tokens[:, :prefix]) if prefix_tokens else features)
    return keras.Model(model.input, outputs, name=f"{model.name}_intermediates")
