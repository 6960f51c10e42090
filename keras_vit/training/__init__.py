"""Training: the run config, the engine and what it is built from.

Backend-agnostic: `config` (`TrainConfig` and its sections, the `--set` override
language; imports neither Keras nor TensorFlow), `optimizers`, `schedules`, `losses`,
`runs` (the run folder and finding weights again: read without TensorFlow, so that
`keras-vit predict --from RUN` needs none) and `callbacks` (TensorFlow imported when
they run in `fit`). TensorFlow-only: `engine` (`train`), `distribute` (`tf.distribute`
strategies), `multiworker` (Keras 3 `fit` under MultiWorkerMirroredStrategy).
JAX-only: `jax_distribution` (`keras.distribution` layouts).

`from keras_vit.training import TrainConfig, train` keeps working; the engine (and so
TensorFlow) is imported on first use.
"""

_ENGINE = ("TrainingModel", "MaskedPatchTraining", "TrainResult", "train")


def __getattr__(name):
    if name == "TrainConfig":
        from keras_vit.training.config import TrainConfig

        return TrainConfig
    if name in _ENGINE:
        from keras_vit.training import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'keras_vit.training' has no attribute {name!r}")
