"""keras-vit: the Vision Transformer for Keras 3 on TensorFlow, JAX and PyTorch.

`import keras_vit` imports neither Keras nor a backend: the names below are imported on
first use (`keras_vit.ViT`, `from keras_vit import ViT`), so that the `keras-vit`
command answers `--help` without starting TensorFlow. The first use of any of them
imports the backend-agnostic modules (models, weights, evaluation), which registers
keras-vit's layers with Keras for `keras.saving.load_model`; so does `import keras_vit`
when Keras is already imported, or the import of Keras that follows it. The TensorFlow-only parts (SavedModel
export, the training engine with tf.data and tf.distribute, the demo) are imported only
when their names are used.

`import keras_vit` leaves the process's allocator alone: `keras_vit.configure_for_backend()`
opts in to keeping freed memory for reuse under JAX and PyTorch (the `keras-vit` command
and the benchmarks do).
"""

import importlib
import importlib.abc
import importlib.util
import sys

from keras_vit.utils.allocator import configure_for_backend  # noqa: F401  (public, in __all__)

__version__ = "0.1.0"

# Public name -> the module defining it. Every module of the first group is imported on
# the first use of any name (they hold the Keras-registered classes).
_EXPORTS = {
    "keras_vit.layers": (
        "ClassToken", "DropPath", "LayerNormalization", "PadToMultiple", "PatchEncoder",
        "Patches", "TokenPooling", "TransformerBlock",
    ),
    "keras_vit.models.vit": (
        "VARIANTS", "ViTParts", "VisionTransformer", "parse_variant", "preprocess", "vit_parts",
    ),
    "keras_vit.models.features": ("feature_model",),
    "keras_vit.models.flexi": ("resample_patch_embedding",),
    "keras_vit.models.mpp": (
        "MaskedPatchPrediction", "corrupt_patch_embeddings", "masked_patch_loss",
        "mean_color_targets",
    ),
    "keras_vit.layers.posembed": ("resample_position_grid", "resample_position_tensor"),
    "keras_vit.models.flops": ("forward_flops",),
    "keras_vit.weights.factory": ("ViT",),
    "keras_vit.weights.pretrained": ("LoadReport", "load_pretrained", "pretrained", "save_npz"),
    "keras_vit.weights.registry": ("WeightsEntry", "list_weights", "register_weights"),
    "keras_vit.evaluation.analysis": (
        "attention_map", "attention_model", "attention_rollout", "mean_attention_distance",
        "patch_embedding_components", "position_embedding_similarity",
    ),
    "keras_vit.evaluation.features": ("extract_features",),
    "keras_vit.evaluation.fewshot": ("FewshotConfig", "evaluate_source", "fewshot_evaluate"),
    "keras_vit.evaluation.ridge": ("RidgeProbe", "linear_fewshot_accuracy"),
    "keras_vit.evaluation.probes": ("drop_patches", "robustness_probes", "shuffle_patches"),
    "keras_vit.data.naflex": ("naflex_inputs",),
}
_SUBMODULES = {  # keras_vit.fewshot, ... as before the sub-packages
    "analysis": "keras_vit.evaluation.analysis",
    "fewshot": "keras_vit.evaluation.fewshot",
    "probes": "keras_vit.evaluation.probes",
}
# TensorFlow-only parts: imported only when used.
_LAZY = {
    "export_saved_model": "keras_vit.export.saved_model",
    "TrainConfig": "keras_vit.training.config",
    "TrainingModel": "keras_vit.training.engine",
    "MultiWorkerModel": "keras_vit.training.multiworker",
    "train": "keras_vit.training.engine",
    "DemoConfig": "keras_vit.demo",
    "run_demo": "keras_vit.demo",
    "classify": "keras_vit.inference",
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted([*_MODULE_OF, *_SUBMODULES, *_LAZY, "configure_for_backend"])


def _load():
    """Imports the backend-agnostic modules once: registers the layers with Keras."""
    if not _load.done:
        _load.done = True
        for module in _EXPORTS:
            importlib.import_module(module)


_load.done = False


def __getattr__(name):
    if name in _MODULE_OF or name in _SUBMODULES:
        _load()
        value = importlib.import_module(_SUBMODULES.get(name) or _MODULE_OF[name])
        return value if name in _SUBMODULES else getattr(value, name)
    if name in _LAZY:
        _load()
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'keras_vit' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])


def _importing_keras_vit_module():
    return any(
        name.startswith("keras_vit.") and getattr(module.__spec__, "_initializing", False)
        for name, module in list(sys.modules.items())
    )


class _LoadAfterKeras(importlib.abc.MetaPathFinder):
    """Registers keras-vit's layers right after Keras is imported, when `import keras`
    comes after `import keras_vit`: a script that only calls `keras.saving.load_model`
    then finds them, as it did when `import keras_vit` imported Keras itself."""

    def find_spec(self, name, path=None, target=None):
        if name != "keras":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                # A keras_vit module that imports Keras is still half-made here, and
                # importing the rest now would reach it (`from keras_vit.models.vit import
                # parse_variant` as a script's first line): its own imports then register
                # what it uses, and the first `keras_vit.<name>` the rest.
                if not _importing_keras_vit_module():
                    _load()

            spec.loader.exec_module = exec_module
        return spec


if "keras" in sys.modules:
    _load()
else:
    sys.meta_path.insert(0, _LoadAfterKeras())
