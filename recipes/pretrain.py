"""Pre-training as in the paper (Dosovitskiy et al. 2020, section 4.1 and Table 3).

ViT-B/16 at 224 px with Adam (0.9, 0.999), batch 4096, learning rate 1e-3 with 10k
linear warmup steps and linear decay to 1e-5, decoupled weight decay 0.1 on kernels
(Table 3: 0.03 on ImageNet-21k, 0.1 on JFT-300M), global-norm clipping at 1, dropout 0.1,
a representation (pre-logits) layer of width 768, sigmoid cross-entropy with the head
bias at -10, inception crop + flip. The paper trains 90 epochs on ImageNet-21k (a
folder source, `--data /path/to/imagenet21k`), 300 on ImageNet.

    keras-vit pretrain --data tfds:imagenet2012 --set optimization.micro_batches_per_update=16
"""

import sys

from keras_vit.training.config import TrainConfig

CONFIG = TrainConfig(
    model=dict(
        variant="B/16", kwargs=dict(representation_size=768, dropout_rate=0.1), image_size=224
    ),
    data=dict(
        source="tfds:imagenet2012", batch_size=4096, augment="none", inception_crop=True,
        random_flip=True,
    ),
    optimization=dict(
        optimizer="adam", weight_decay=0.1, clip_norm=1.0, loss="sigmoid"
    ),
    schedule=dict(
        learning_rate=1e-3, decay="linear", warmup_updates=10_000, end_learning_rate=1e-5,
        epochs=300,
    ),
    checkpointing=dict(backup_every_micro_batches=1000),
    evaluation=dict(crop_fraction=0.875),
    out="runs/pretrain",
)

if __name__ == "__main__":
    from keras_vit.cli import main

    sys.exit(main(["pretrain", "--recipe", __file__, *sys.argv[1:]]))
