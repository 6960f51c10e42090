"""Models for serving, outside Keras.

- `saved_model`: a TensorFlow SavedModel with the eval preprocessing inside (TensorFlow-only).
- `onnx`: an ONNX file from any backend, checked with onnxruntime.
"""
