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

from keras_vit.training.engine import TrainConfig

CONFIG = TrainConfig(
    model="B/16",
    image_size=384,
    data="tfds:cifar10",
    batch_size=512,
    epochs=1,  # superseded by steps
    steps=10_000,
    optimizer="sgd",
    momentum=0.9,
    learning_rate=0.03,
    weight_decay=0.0,
    schedule="cosine",
    warmup_steps=500,
    clip_norm=1.0,
    loss="softmax",
    augment="none",
    inception_crop=True,
    random_flip=True,
    eval_crop_fraction=1.0,
    backup_every=500,
    out="runs/finetune",
)

if __name__ == "__main__":
    from keras_vit.cli import main

    sys.exit(main(["finetune", "--recipe", __file__, *sys.argv[1:]]))
