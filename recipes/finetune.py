"""Fine-tuning as in the paper (section 4.1, appendix B.1.1) and vit_jax configs/common.py.

SGD with momentum 0.9, no weight decay, batch 512, learning rate 0.03 (the paper sweeps
0.001-0.03) with 500 linear warmup steps and cosine decay, global-norm clipping at 1,
softmax cross-entropy, no dropout, at 384 px: higher than pre-training, so the position
embedding is resampled to the new patch grid when `--from` weights are loaded, and the
head is reset to zeros when the class count differs. Steps: CIFAR-10/100 10k,
ImageNet 20k, Pets/Flowers 500.

    keras-vit finetune --from ViT-B_16.npz --data tfds:cifar10
"""

import sys

from keras_vit.training.config import TrainConfig

CONFIG = TrainConfig(
    model=dict(variant="B/16", image_size=384),
    data=dict(
        source="tfds:cifar10", batch_size=512, augment="none", inception_crop=True,
        random_flip=True,
    ),
    optimization=dict(
        optimizer="sgd", momentum=0.9, weight_decay=0.0, clip_norm=1.0, loss="softmax"
    ),
    schedule=dict(
        learning_rate=0.03, decay="cosine", warmup_updates=500, updates=10_000,
    ),
    checkpointing=dict(backup_every_micro_batches=500),
    evaluation=dict(crop_fraction=1.0),
    out="runs/finetune",
)

if __name__ == "__main__":
    from keras_vit.cli import main

    sys.exit(main(["finetune", "--recipe", __file__, *sys.argv[1:]]))
