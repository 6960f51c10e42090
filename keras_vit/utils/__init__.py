"""Small shared utilities with no model logic.

- `allocator`: keeps the memory that XLA:CPU (JAX) and PyTorch free for the next step.
- `checks`: the argument checks every module uses (one wording for each kind of error).
- `serialization`: registers keras-vit's classes with Keras' serialization.
- `keras_compat`: every use of Keras' private internals, in one place, each one tested.
- `files`: crash-safe files (temporary names, atomic moves into place).
- `model_files`: reads whole Keras models from disk (`.keras` files, sharded `.orbax`
  checkpoints).
- `sharded_state`: sharded arrays and models on disk through Orbax (JAX).
- `extras`: optional packages, imported where used and named by the extra that installs them.
"""
