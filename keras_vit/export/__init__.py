"""Models for serving, outside Keras.

- `saved_model`: a TensorFlow SavedModel with the eval preprocessing inside (TensorFlow-only).
- `onnx`: an ONNX file from any backend, checked with onnxruntime.
- `tflite`: a LiteRT (TFLite) file, float or with int8 weights (TensorFlow-only).
- `records`: what every exported file states about its input and preprocessing.
"""
