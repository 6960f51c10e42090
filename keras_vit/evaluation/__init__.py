"""Measuring a model: few-shot linear evaluation, robustness probes, attention analysis.

- `fewshot`: the paper's few-shot linear evaluation (features, ridge solver, driver).
- `probes`: accuracy under patch occlusion and cell shuffling.
- `analysis`: attention maps and rollout, attention distance, position-embedding
  similarity, patch-embedding filters (the paper's Fig. 6 and 7).
"""
