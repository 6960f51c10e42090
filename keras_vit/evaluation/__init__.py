"""Measuring a model: few-shot linear evaluation, robustness probes, attention analysis.

- `features`: a model's frozen representation of images (`extract_features`).
- `ridge`: the closed-form ridge probe scored on those features (`RidgeProbe`).
- `fewshot`: the paper's few-shot linear evaluation: shots, seeds, L2 choice, sources.
- `fewshot_report`: few-shot results as a table and as files.
- `probes`: accuracy under patch occlusion and cell shuffling.
- `charts`: the few-shot and probe charts those files include (matplotlib).
- `analysis`: attention maps and rollout, attention distance, position-embedding
  similarity, patch-embedding filters (the paper's Fig. 6 and 7).
"""
