"""A tiny ViT on scikit-learn's digits: trains in about a minute on 2 CPU cores, no network.

Digits are 8x8 grey images; they are upscaled to 16x16 (one channel) and cut into a 4x4
grid of 4x4 patches, so that neighbouring patches overlap in what they see of the
original pixels. Two Transformer blocks of width 64, Adam with decoupled weight decay
on the kernels, warmup + cosine decay, global-norm clipping: the paper's recipe at toy
scale. No crops or flips (a flipped digit is another digit, and crops of 8x8 images
lose the digit). Reaches about 97% on the 360 test digits.

    keras-vit pretrain --recipe demo
    keras-vit finetune --recipe demo --from runs/demo --out runs/demo32 --set image_size=32
"""

import sys

from keras_vit.training import TrainConfig

CONFIG = TrainConfig(
    model="custom",
    model_kwargs=dict(patch_size=4, hidden_dim=64, num_layers=2, num_heads=4, mlp_dim=128),
    image_size=16,
    channels=1,
    data="digits",
    batch_size=64,
    epochs=15,
    optimizer="adam",
    learning_rate=2e-3,
    weight_decay=0.05,
    schedule="cosine",
    warmup_steps=40,
    clip_norm=1.0,
    loss="softmax",
    inception_crop=False,
    random_flip=False,
    eval_crop_fraction=1.0,
    out="runs/demo",
)

if __name__ == "__main__":
    from keras_vit.cli import main

    sys.exit(main(["pretrain", "--recipe", __file__, *sys.argv[1:]]))
