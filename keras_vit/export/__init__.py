"""Models for serving, outside Keras (TensorFlow-only).

- `saved_model`: a TensorFlow SavedModel with the eval preprocessing inside.
"""
