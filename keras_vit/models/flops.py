"""Analytic FLOP counts of keras-vit models, for throughput and utilisation figures."""

import math

import keras

from keras_vit import layers as vit_layers


def forward_flops(model):
    """Floating-point operations of one image's forward pass through `model`.

    Counts the matrix products, two FLOPs per multiply-add as PyTorch's
    `FlopCounterMode` does: the patch projection, every Dense layer, and the
    attention's `q k^T` and `weights v` products (`4 * tokens**2 * width` a block).
    Norms, softmax, GELU and additions are left out; they are under 1% of a ViT's
    work. A training step (forward and backward) is about three times this.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT("Ti/16", image_size=224)
    >>> round(forward_flops(model) / 1e9, 2)  # GFLOP per image
    2.51
    """
    if any(side is None for side in model.input_shape[1:]):
        raise ValueError(
            f"forward_flops counts the work at one input size; model {model.name!r} takes "
            f"input shape {model.input_shape}: count a model built at the size you run "
            "(without dynamic_image_size)."
        )
    total = 0
    for layer in model.layers:
        if isinstance(layer, vit_layers.PatchEncoder):
            total += _dense_flops(layer.projection, layer.input.shape)
        elif isinstance(layer, vit_layers.TransformerBlock):
            tokens, width = layer.input.shape[1:]
            total += sum(
                _dense_flops(dense, layer.input.shape)
                for dense in (layer.qkv, layer.attention_output, layer.mlp_fc1)
            )
            total += _dense_flops(layer.mlp_fc2, (None, tokens, layer.mlp_dim))
            total += 4 * tokens * tokens * width
        elif isinstance(layer, keras.layers.Dense):
            total += _dense_flops(layer, layer.input.shape)
    return total


def _dense_flops(dense, input_shape):
    rows = math.prod(input_shape[1:-1])
    return 2 * rows * input_shape[-1] * dense.units
