"""Self-supervised masked patch prediction, as in the paper (section 4.6, appendix B.1.2).

Half of each image's patch embeddings are corrupted (80% of those replaced by a learned
[mask] embedding, 10% by another patch's embedding, 10% kept) and the encoder predicts
the 3-bit mean colour (512 classes) of every corrupted patch; labels are not used.
ViT-B/16 at 224 px, batch 4096, Adam with base learning rate 2e-4, 10k warmup steps
and cosine decay, 1M steps (the paper: about 14 epochs of JFT-300M, which is not
public; any labelled source works, its labels are ignored). Weight decay, gradient
clipping and augmentation are not stated for this run: no weight decay, clipping at 1
and inception crop + flip as in supervised pre-training. Fine-tuned on ImageNet, the
encoder reached 79.9%: 2% more than training from scratch, still 4% behind
supervised pre-training.

The run saves the encoder (no head) as `model.keras`; fine-tune or few-shot evaluate it
with `--from`:

    keras-vit pretrain --recipe mpp --data tfds:imagenet2012 --set optimization.micro_batches_per_update=16
    keras-vit finetune --from runs/pretrain_mpp --data tfds:cifar10

`recipes/demo_mpp.py` is the same objective at digits size (about a minute on a CPU).
"""

import sys

from keras_vit.training.config import TrainConfig

CONFIG = TrainConfig(
    model=dict(variant="B/16", image_size=224),
    data=dict(
        source="tfds:imagenet2012", batch_size=4096, inception_crop=True, random_flip=True
    ),
    optimization=dict(
        objective="mpp", mpp_bits=3, mpp_corrupt_rate=0.5, mpp_mask_rate=0.8,
        mpp_random_rate=0.1, optimizer="adam", weight_decay=0.0, clip_norm=1.0,
    ),
    schedule=dict(
        learning_rate=2e-4, decay="cosine", warmup_updates=10_000, updates=1_000_000
    ),
    checkpointing=dict(backup_every_micro_batches=1000),
    # The encoder is judged by fine-tuning and few-shot evaluation.
    evaluation=dict(enabled=False),
    out="runs/pretrain_mpp",
)

if __name__ == "__main__":
    from keras_vit.cli import main

    sys.exit(main(["pretrain", "--recipe", __file__, *sys.argv[1:]]))
