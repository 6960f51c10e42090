"""Checkpoints: the registry of official weights, fetching them, reading every supported
layout, loading into a ViT, writing `.npz`.

- `registry`: the official checkpoints by name (`list_weights`, `register_weights`),
  AugReg file names, the bundled ImageNet class names (`labels/`).
- `download`: a cached, verified download (`KERAS_VIT_CACHE`,
  `KERAS_VIT_WEIGHTS_MIRROR`), and `hf:` / `timm:` sources through `huggingface_hub`.
- `cache`: the cache folder and its `index.json`, which pins each file's SHA-256 and
  size on first use (`keras-vit weights --verify` re-hashes the cache against it).
- `formats`: reads official/AugReg, big_vision, HF and timm files into the official
  vit_jax layout (numpy only).
- `pretrained`: `pretrained(name)`, `load_pretrained(model, source)` and
  `save_npz(model, path)`.
"""
