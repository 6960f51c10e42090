"""Checkpoints: reading every supported layout, loading into a ViT, writing `.npz`.

- `formats`: reads official/AugReg, big_vision, HF and timm files into the official
  vit_jax layout (numpy only).
- `pretrained`: `load_pretrained(model, source)` and `save_npz(model, path)`.
"""
