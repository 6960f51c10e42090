"""keras-vit: the Vision Transformer for Keras 3 on TensorFlow, JAX and PyTorch."""

from keras_vit.layers import (
    ClassToken,
    DropPath,
    PatchEncoder,
    Patches,
    TokenPooling,
    TransformerBlock,
)
from keras_vit.model import VARIANTS, ViT, parse_variant, preprocess

__version__ = "0.1.0"

# The training engine needs TensorFlow (tf.data, tf.distribute): imported on first use,
# so that `import keras_vit` stays cheap on the JAX and PyTorch backends.
_TRAINING = ("TrainConfig", "TrainingModel", "train")


def __getattr__(name):
    if name in _TRAINING:
        from keras_vit import training

        return getattr(training, name)
    raise AttributeError(f"module 'keras_vit' has no attribute {name!r}")
