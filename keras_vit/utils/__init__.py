"""Small shared utilities with no model logic.

- `allocator`: keeps the memory that XLA:CPU (JAX) and PyTorch free for the next step
  (opt-in: `configure_for_backend`).
- `checks`: the argument checks every module uses (one wording for each kind of error).
- `serialization`: registers keras-vit's classes with Keras' serialization.
- `keras_compat`: every use of Keras' private internals, in one place, each one tested.
- `files`: crash-safe files (temporary names, atomic moves into place).
- `model_files`: reads whole Keras models from disk (`.keras` files, sharded `.orbax`
  checkpoints).
- `errors`: `DamagedModel`, for a model on disk that cannot serve (both readers raise it).
- `sharded_state`: sharded arrays and models on disk through Orbax (JAX).
- `tf_data`: the `tf.data` datasets handed to Keras: without autotuning, arrays in batches
  (TensorFlow).
- `devices`: the device a framework computes on, by name.
- `extras`: optional packages, imported where used and named by the extra that installs them.
"""
