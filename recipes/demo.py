"""A tiny ViT on scikit-learn's digits, and the demo pipeline built on it; no network.

`CONFIG` trains on all ten digits in about a minute on 2 CPU cores. Digits are 8x8 grey
images; they are upscaled to 16x16 (one channel) and cut into a 4x4 grid of 4x4 patches,
so that neighbouring patches overlap in what they see of the original pixels. Two
Transformer blocks of width 64, Adam with decoupled weight decay on the kernels, warmup +
cosine decay, global-norm clipping: the paper's recipe at toy scale. No crops or flips (a
flipped digit is another digit, and crops of 8x8 images lose the digit). Reaches about
97% on the 360 test digits.

`DEMO` is the paper's pipeline in miniature (`keras-vit demo`, `keras_vit.demo`): a
narrower ViT (width 32) pretrained on digits 0-4 at their own 8x8 size (a 4x4 grid of
2x2 patches) with random shifts; few-shot linear evaluation (1, 5, 10, 25 shots, 3 seeds,
l2 chosen per shot count on held-out train examples) on digits 5-9, against the same
architecture with random weights; fine-tuning on 5-9 at 16x16 (an 8x8 patch grid, the
position embedding resampled) with SGD and momentum, no weight decay, cosine decay and a
zero-initialised head, as the paper fine-tunes.

    keras-vit pretrain --recipe demo                  # writes runs/digits
    keras-vit finetune --recipe demo --from runs/digits --out runs/digits32 --set model.image_size=32
    keras-vit demo                                    # writes runs/demo (pretrain/, finetune/)
"""

import sys

from keras_vit.demo import DemoConfig
from keras_vit.evaluation.fewshot import FewshotConfig
from keras_vit.training.config import TrainConfig

CONFIG = TrainConfig(
    model=dict(
        variant="custom",
        kwargs=dict(patch_size=4, hidden_dim=64, num_layers=2, num_heads=4, mlp_dim=128),
        image_size=16,
        channels=1,
    ),
    data=dict(source="digits", batch_size=64, inception_crop=False, random_flip=False),
    optimization=dict(
        optimizer="adam", weight_decay=0.05, clip_norm=1.0, loss="softmax"
    ),
    schedule=dict(learning_rate=2e-3, decay="cosine", warmup_updates=40, epochs=15),
    evaluation=dict(crop_fraction=1.0),
    out="runs/digits",
)

# Shifts of up to 15% of the side: without them the representation learns where strokes
# are rather than what they form, and transfers to unseen digits no better than random.
# Given in serialized form: making a Keras layer starts TensorFlow, and a multi-worker run
# (`--strategy multiworker`) must create its strategy first.
SHIFT = dict(
    class_name="RandomTranslation",
    config=dict(height_factor=0.15, width_factor=0.15, fill_mode="constant", fill_value=0.0),
)

DEMO_MODEL = dict(patch_size=2, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=64)

# What both training stages of the demo share: the model, the shifts, no weight decay.
DEMO_BASE = CONFIG.replace(
    model=dict(kwargs=DEMO_MODEL),
    data=dict(augmentations=[SHIFT]),
    optimization=dict(weight_decay=0.0),
    checkpointing=dict(tensorboard=False),
)

DEMO = DemoConfig(
    pretrain=DEMO_BASE.replace(
        model=dict(image_size=8), data=dict(classes="0-4"), schedule=dict(epochs=40)
    ),
    fewshot=FewshotConfig(
        data="digits", classes="5-9", shots=(1, 5, 10, 25), seeds=3, sweep=True
    ),
    finetune=DEMO_BASE.replace(
        model=dict(image_size=16),
        data=dict(classes="5-9"),
        optimization=dict(optimizer="sgd", momentum=0.9),
        schedule=dict(learning_rate=0.03, warmup_updates=10, epochs=40),
    ),
    out="runs/demo",
)

if __name__ == "__main__":
    from keras_vit.cli import main

    sys.exit(main(["pretrain", "--recipe", __file__, *sys.argv[1:]]))
