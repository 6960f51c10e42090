"""The Vision Transformer models, built from `keras_vit.layers`; `keras.ops` only, every backend.

- `architecture`: `Architecture`, the model's architecture arguments as one checked
  description, which its config records.
- `vit`: the `ViT` model (built from its `Architecture`), its paper variants,
  `preprocess`, and `ViTParts` / `vit_parts`: the model's layers by role, which every
  other module reads the structure from.
- `preprocessing`: the pixel mean, std, resize and crop a checkpoint expects, and
  `normalize`, the one map from pixels to model inputs.
- `naflex_mode`: a model's NaFlex mode for serving: `is_naflex`, its token budget and
  NaFlex preprocessing, `naflex_twin` (a fixed-grid model's weights in a NaFlex model).
- `resnet`: the BiT-style ResNet trunk of the hybrid models.
- `features`: `feature_model`, the token features after chosen blocks (maps or sequences).
- `flexi`: `resample_patch_embedding`, FlexiViT's patch-size resampling.
- `mpp`: the masked-patch-prediction head and its corruption and targets.
- `flops`: analytic FLOP counts.
"""
