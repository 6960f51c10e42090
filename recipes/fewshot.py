"""Few-shot linear evaluation as the paper reports it (big_vision's few-shot evaluator).

Shots 1, 5, 10 and 25 per class, 3 seeds each, a closed-form ridge fit from the frozen
representation (pooled or pre_logits output) to {-1, 1} targets with l2 = 2^10, as
big_vision fixes it (`sweep=True` chooses it per shot count on held-out train examples).
Images are resized to the model's input size, 256 per forward pass.

    keras-vit fewshot --from runs/digits --data digits
    keras-vit fewshot --from runs/demo/pretrain --data digits --classes 5-9 --l2 sweep
"""

import sys

from keras_vit.evaluation.fewshot import DEFAULT_L2, FewshotConfig

CONFIG = FewshotConfig(
    data="digits",
    shots=(1, 5, 10, 25),
    seeds=3,
    l2=DEFAULT_L2,  # 2**10
    sweep=False,
    batch_size=256,
    crop_fraction=1.0,
    out="runs/fewshot",
)

if __name__ == "__main__":
    from keras_vit.cli import main

    sys.exit(main(["fewshot", "--recipe", __file__, *sys.argv[1:]]))
