"""keras-vit: the Vision Transformer for Keras 3 on TensorFlow, JAX and PyTorch."""

from keras_vit.layers import (
    ClassToken,
    DropPath,
    PatchEncoder,
    Patches,
    TokenPooling,
    TransformerBlock,
)
from keras_vit.flops import forward_flops
from keras_vit.model import VARIANTS, ViT, VisionTransformer, parse_variant, preprocess

__version__ = "0.1.0"
