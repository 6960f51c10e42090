"""The Vision Transformer's layers, one kind per module; `keras.ops` only, every backend.

Weight layouts are chosen so that the official checkpoints map onto them by reshapes
alone (see `keras_vit.weights.pretrained`).

- `normalization`: `LayerNormalization`.
- `dense`: `Dense`, on the backends' fastest products.
- `patches`: `Patches`, `PadToMultiple`.
- `embedding`: `PatchEncoder` (patch and position embedding), `ClassToken`,
  `sincos_2d_table`.
- `posembed`: resampling a position-embedding grid to another patch grid, or to each
  token's image grid (NaFlex).
- `naflex`: `NaFlexPatches`, `TokenMask`, `mask_bias`, `masked_mean`: images of
  several sizes in one padded batch; `PackedNaFlexPatches`, `SlotPrefix`, `PackSlots`,
  `SlotMasks`: several images in one row (NaViT's packing).
- `rope`: `RotaryEmbedding` (EVA-02's), `rotate`.
- `dinov3_rope`: `DINOv3RotaryEmbedding` (patch centres on [-1, 1]).
- `attention`: `Attention`.
- `mlp`: `MLP`, `mlp_activation`.
- `drop_path`: `DropPath`.
- `pooling`: `TokenPooling`, `MAPHead`.
- `block`: `TransformerBlock`.

Every module is imported here, so that importing the package registers every layer
with Keras (for `keras.saving.load_model`).
"""

from keras_vit.layers.attention import Attention
from keras_vit.layers.block import TransformerBlock
from keras_vit.layers.dense import Dense
from keras_vit.layers.dinov3_rope import DINOv3RotaryEmbedding
from keras_vit.layers.drop_path import DropPath
from keras_vit.layers.embedding import ClassToken, PatchEncoder, sincos_2d_table
from keras_vit.layers.mlp import MLP, mlp_activation
from keras_vit.layers.naflex import (
    NaFlexPatches, PackedNaFlexPatches, PackSlots, SlotMasks, SlotPrefix, TokenMask,
)
from keras_vit.layers.normalization import LayerNormalization
from keras_vit.layers.patches import PadToMultiple, Patches
from keras_vit.layers.pooling import MAPHead, TokenPooling
from keras_vit.layers.rope import RotaryEmbedding, rotate

__all__ = [
    "Attention", "ClassToken", "DINOv3RotaryEmbedding", "Dense", "DropPath", "LayerNormalization", "MAPHead", "MLP",
    "NaFlexPatches", "PackSlots", "PackedNaFlexPatches", "PadToMultiple", "PatchEncoder", "Patches", "RotaryEmbedding", "SlotMasks", "SlotPrefix", "TokenMask", "TokenPooling",
    "TransformerBlock", "mlp_activation", "rotate", "sincos_2d_table",
]
