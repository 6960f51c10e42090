"""Backend-specific code, in one place: what `keras.ops` lacks or computes slower than a
backend can, and the forms the exporters follow. Everything else of the model is
`keras.ops` only.

- `products`: 16-bit products accumulated in float32 on XLA's 16-bit kernels, the
  swapaxes and bias add whose gradients stay on them, and PyTorch's one-call `dense`.
- `attention`: softmax attention on each backend's fused kernel, and whether that
  kernel beats explicit products on this backend and device.
- `erf`: the error function from multiplies and adds, which every XLA consumer loads.
- `export`: `tracing_for_export()`, inside which layers trace the forms every exporter
  follows.
- `calls`: calling a built sublayer without `Layer.__call__`'s overhead on PyTorch.
- `eager`: the keras.ops a block calls on every step (layer normalisation, GELU, the
  head split), without the Python of each keras.ops call on PyTorch.
- `optimizer`: Keras' Adam update and global-norm clip in PyTorch's fused and foreach
  kernels.
"""
