"""keras-vit: the Vision Transformer for Keras 3 on TensorFlow, JAX and PyTorch."""

import keras

from keras_vit.allocator import configure_for_backend
from keras_vit.analysis import (
    attention_map,
    attention_model,
    attention_rollout,
    mean_attention_distance,
    patch_embedding_components,
    position_embedding_similarity,
)
from keras_vit.checkpoints import LoadReport, load_pretrained, save_npz
from keras_vit.fewshot import (
    FewshotConfig,
    RidgeProbe,
    evaluate_source,
    extract_features,
    fewshot_evaluate,
    linear_fewshot_accuracy,
)
from keras_vit.flops import forward_flops
from keras_vit.layers import (
    ClassToken,
    DropPath,
    PatchEncoder,
    Patches,
    TokenPooling,
    TransformerBlock,
)
from keras_vit.model import VARIANTS, ViT, VisionTransformer, parse_variant, preprocess
from keras_vit.mpp import (
    MaskedPatchPrediction,
    corrupt_patch_embeddings,
    masked_patch_loss,
    mean_color_targets,
)
from keras_vit.posembed import resample_position_grid
from keras_vit.probes import drop_patches, robustness_probes, shuffle_patches

__version__ = "0.1.0"

configure_for_backend(keras.backend.backend())

# TensorFlow-only parts (SavedModel export, the training engine with tf.data and
# tf.distribute, the demo pipeline) are imported on first use: TensorFlow is slow to
# import and unused by the JAX and PyTorch backends until then.
_LAZY = {
    "export_saved_model": "keras_vit.export",
    "TrainConfig": "keras_vit.training",
    "TrainingModel": "keras_vit.training",
    "MultiWorkerModel": "keras_vit.multiworker",
    "train": "keras_vit.training",
    "DemoConfig": "keras_vit.demo",
    "run_demo": "keras_vit.demo",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'keras_vit' has no attribute {name!r}")
