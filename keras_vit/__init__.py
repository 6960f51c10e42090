"""keras-vit: the Vision Transformer for Keras 3 on TensorFlow, JAX and PyTorch."""

import keras

from keras_vit.utils.allocator import configure_for_backend
from keras_vit.evaluation import analysis, fewshot, probes  # noqa: F401  (keras_vit.fewshot, ...)
from keras_vit.evaluation.analysis import (
    attention_map,
    attention_model,
    attention_rollout,
    mean_attention_distance,
    patch_embedding_components,
    position_embedding_similarity,
)
from keras_vit.weights.pretrained import LoadReport, load_pretrained, save_npz
from keras_vit.evaluation.fewshot import (
    FewshotConfig,
    RidgeProbe,
    evaluate_source,
    extract_features,
    fewshot_evaluate,
    linear_fewshot_accuracy,
)
from keras_vit.models.features import feature_model
from keras_vit.models.flexi import resample_patch_embedding
from keras_vit.models.flops import forward_flops
from keras_vit.models.layers import (
    ClassToken,
    DropPath,
    PatchEncoder,
    Patches,
    TokenPooling,
    TransformerBlock,
)
from keras_vit.models.vit import (
    VARIANTS,
    ViT,
    ViTParts,
    VisionTransformer,
    parse_variant,
    preprocess,
    vit_parts,
)
from keras_vit.models.mpp import (
    MaskedPatchPrediction,
    corrupt_patch_embeddings,
    masked_patch_loss,
    mean_color_targets,
)
from keras_vit.models.posembed import resample_position_grid
from keras_vit.evaluation.probes import drop_patches, robustness_probes, shuffle_patches

__version__ = "0.1.0"

configure_for_backend(keras.backend.backend())

# TensorFlow-only parts (SavedModel export, the training engine with tf.data and
# tf.distribute, the demo pipeline) are imported on first use: TensorFlow is slow to
# import and unused by the JAX and PyTorch backends until then.
_LAZY = {
    "export_saved_model": "keras_vit.export.saved_model",
    "TrainConfig": "keras_vit.training.engine",
    "TrainingModel": "keras_vit.training.engine",
    "MultiWorkerModel": "keras_vit.training.multiworker",
    "train": "keras_vit.training.engine",
    "DemoConfig": "keras_vit.demo",
    "run_demo": "keras_vit.demo",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'keras_vit' has no attribute {name!r}")
