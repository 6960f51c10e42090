"""The Vision Transformer as Keras layers and models; `keras.ops` only, every backend.

- `layers`: `Patches`, `PatchEncoder`, `ClassToken`, `TransformerBlock`, `TokenPooling`,
  `DropPath` and the attention and GELU numerics they share.
- `vit`: the functional `ViT(...)` model, its paper variants and `preprocess`.
- `resnet`: the BiT-style ResNet trunk of the hybrid models.
- `posembed`: resampling a position-embedding grid to another patch grid.
- `mpp`: the masked-patch-prediction head and its corruption and targets.
- `flops`: analytic FLOP counts.
"""
