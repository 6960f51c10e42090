"""Small shared utilities with no model logic.

- `allocator`: keeps the memory XLA:CPU frees under JAX for the next step.
"""
