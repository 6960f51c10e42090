"""LoRA fine-tuning: low-rank updates of the attention and MLP kernels, the rest frozen.

Keras' `Dense.enable_lora(rank)` adds factors `A` (in x rank) and `B` (rank x out, zero
at first) to a frozen kernel `W`, so the layer computes `x (W + A B * alpha / rank)`.
Saving a Dense layer (`.keras`, and so a run's `model.keras` and checkpoints) stores
the merged kernel, so what a run saves, and what `keras-vit export` serves, is the
plain architecture. Backend-agnostic (`keras` only).
"""


from keras_vit.layers.block import TransformerBlock
from keras_vit.layers.pooling import MAPHead
from keras_vit.models.vit import vit_parts
from keras_vit.utils.checks import check_positive_int

# The Dense layers of every TransformerBlock that get factors.
TARGETS = TransformerBlock.DENSE_LAYERS


def enable_lora(model, rank, *, train_norms=False):
    """Adds rank-`rank` LoRA factors to the attention and MLP kernels (a `MAPHead`'s
    too) and freezes the rest.

    What stays trainable: the factors, the heads (a new task's classifier; DeiT's
    `head_dist` too) and, with
    `train_norms`, the LayerNorm scales and offsets. The biases of the factored layers
    and every other weight (patch embedding, positions, class token) are frozen.

    Args:
        model: a built keras-vit model (`keras_vit.ViT`).
        rank: the rank of the factors, a positive int.
        train_norms: also train the LayerNorms.

    Returns:
        A dict: `trainable` and `total` parameter counts and `layers` (how many Dense
        layers got factors).

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=2,
    ...                       num_heads=4, mlp_dim=64, num_classes=3)
    >>> enable_lora(model, 4)
    {'trainable': 3171, 'total': 27075, 'layers': 8}
    """
    check_positive_int("LoRA rank", rank)
    parts = vit_parts(model)
    blocks = parts.blocks
    widths = [min(block.qkv.kernel.shape) for block in blocks]
    if rank >= min(widths):
        raise ValueError(
            f"LoRA rank {rank} is not below the width of the kernels ({min(widths)}): "
            "a factorisation that large is full fine-tuning; use a smaller rank."
        )
    factored = [getattr(block, name) for block in blocks for name in TARGETS]
    map_head = parts.pool if isinstance(parts.pool, MAPHead) else None
    if map_head is not None:  # SigLIP's pooling: attention and MLP kernels too
        factored.extend(map_head.projections())
    if any(layer.lora_enabled for layer in factored):
        raise ValueError(f"Model {model.name!r} already has LoRA factors.")
    for layer in factored:
        layer.enable_lora(rank)
    trainable = {id(v) for layer in factored for v in (layer.lora_kernel_a, layer.lora_kernel_b)}
    # A headless encoder (include_top=False) trains its factors only.
    trainable |= {id(v) for head in parts.heads for v in head.weights}
    if train_norms:
        norms = [parts.norm] + [norm for block in blocks for norm in (block.norm1, block.norm2)]
        norms += [norm for norm in (parts.pre_norm, map_head and map_head.norm) if norm]
        trainable |= {id(v) for layer in norms for v in layer.weights}
    for variable in model.weights:
        variable.trainable = id(variable) in trainable
    return {
        "trainable": sum(int(_size(v)) for v in model.trainable_weights),
        "total": sum(int(_size(v)) for v in model.weights),
        "layers": len(factored),
    }


def _size(variable):
    count = 1
    for dim in variable.shape:
        count *= dim
    return count
