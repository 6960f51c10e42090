"""Self-supervised masked patch prediction, the paper's section 4.6 and appendix B.1.2.

Half of an image's patch embeddings are corrupted (of those, 80% replaced by a learned
[mask] embedding, 10% by another patch's embedding, 10% left as they are) and the
encoder predicts the 3-bit mean colour of every corrupted patch from its output token.
Everything here uses `keras.ops` and seeded `keras.random`, so it runs on the
TensorFlow, JAX and PyTorch backends and under `tf.distribute`.
"""

import keras
from keras import ops

from keras_vit.layers.patches import Patches
from keras_vit.models.preprocessing import DEFAULT, model_preprocessing, shift_and_scale
from keras_vit.models.vit import vit_parts
from keras_vit.utils.checks import check_in_range, check_positive_int
from keras_vit.utils.serialization import serializable

# What `corrupt_patch_embeddings` did to each position.
CLEAN, MASKED, REPLACED, KEPT = 0, 1, 2, 3


def check_corruption_rates(corrupt_rate, mask_rate, random_rate, prefix=""):
    """Raises `ValueError` naming a corruption rate (as `{prefix}{name}`) out of range.

    Example:

    >>> check_corruption_rates(0.5, 0.8, 0.3, prefix="mpp_")
    Traceback (most recent call last):
        ...
    ValueError: mpp_mask_rate + mpp_random_rate must be at most 1, got 0.8 + 0.3.
    """
    for name, rate in (("corrupt_rate", corrupt_rate), ("mask_rate", mask_rate),
                       ("random_rate", random_rate)):
        check_in_range(f"{prefix}{name}", rate, "[0, 1]")
    if mask_rate + random_rate > 1.0:
        raise ValueError(
            f"{prefix}mask_rate + {prefix}random_rate must be at most 1, got "
            f"{mask_rate} + {random_rate}."
        )


def mean_color_codes(patches, channels, bits=3, preprocessing=None):
    """Class codes of the quantised mean colour of flattened patches.

    Args:
        patches: `(batch, num_patches, P * P * channels)` as `Patches` makes them,
            with pixel values in the model's input units: [-1, 1], or those of
            `preprocessing`.
        channels: colour channels per pixel.
        bits: bits per channel; each channel's mean, in [-1, 1] pixel units whatever
            the preprocessing, is cut into `2**bits` equal bins, so that the classes
            are the same colours for every checkpoint.
        preprocessing: the model's preprocessing dict (`keras_vit.models.preprocessing`),
            None for pixels in [-1, 1].

    Returns:
        int32 codes of shape `(batch, num_patches)` in `[0, 2**(bits * channels))`,
        the first channel most significant (RGB with 3 bits: `r * 64 + g * 8 + b`).

    Example:

    >>> patches = keras.ops.ones((1, 4, 48))  # white 4x4 RGB patches
    >>> keras.ops.convert_to_numpy(mean_color_codes(patches, 3)).tolist()
    [[511, 511, 511, 511]]
    """
    bits = check_positive_int("bits", bits)
    if patches.shape[-1] % channels:
        raise ValueError(
            f"Patches of length {patches.shape[-1]} do not hold whole pixels of "
            f"{channels} channels."
        )
    levels = 2**bits
    pixels = ops.reshape(
        patches, (-1, ops.shape(patches)[1], patches.shape[-1] // channels, channels)
    )
    means = ops.mean(ops.cast(pixels, "float32"), axis=2)
    if preprocessing is not None:
        # Back to [-1, 1]: pixel / 127.5 - 1 with pixel = x * 255 std + 255 mean (the
        # mean is linear, so its value maps as every pixel does).
        shift, scale = shift_and_scale(preprocessing)
        means = means * ops.convert_to_tensor(scale / 127.5, "float32") + ops.convert_to_tensor(
            shift / 127.5 - 1.0, "float32"
        )
    level = ops.clip(ops.floor((means + 1.0) * (levels / 2.0)), 0, levels - 1)
    # The first channel is the most significant digit of the code, in base `levels`.
    weights = ops.convert_to_tensor(
        [levels ** (channels - 1 - c) for c in range(channels)], "float32"
    )
    return ops.cast(ops.sum(level * weights, axis=-1), "int32")


def mean_color_targets(images, patch_size, bits=3, preprocessing=None):
    """The masked-patch-prediction targets: each patch's quantised mean colour.

    Each channel's mean over the patch, in [-1, 1], falls in one of `2**bits` equal
    bins; the bins of all channels form one class code, the first channel most
    significant. RGB images with `bits=3` give the paper's 512 classes
    (`r * 64 + g * 8 + b`); 1-channel images give 8.

    Args:
        images: `(batch, height, width, channels)` scaled to [-1, 1], or normalised
            with `preprocessing` (see `preprocess`).
        patch_size: side of the square patches, as the encoder's.
        bits: bits per channel.
        preprocessing: the encoder's preprocessing dict, None for [-1, 1].

    Returns:
        int32 codes of shape `(batch, num_patches)`, patches in row-major order.

    Example:

    >>> images = -keras.ops.ones((1, 8, 8, 3))  # black
    >>> keras.ops.convert_to_numpy(mean_color_targets(images, 4)).tolist()
    [[0, 0, 0, 0]]
    """
    if len(images.shape) != 4:
        raise ValueError(
            f"mean_color_targets expects images of shape (batch, height, width, "
            f"channels), got shape {tuple(images.shape)}."
        )
    return mean_color_codes(Patches(patch_size)(images), images.shape[-1], bits, preprocessing)


def corrupt_patch_embeddings(
    embeddings, mask_embedding, seed, corrupt_rate=0.5, mask_rate=0.8, random_rate=0.1
):
    """Corrupts patch embeddings as BERT corrupts words.

    In every image exactly `round(corrupt_rate * num_patches)` positions (at least
    one when `corrupt_rate > 0`) are chosen uniformly. Each chosen position
    independently becomes the `mask_embedding` with probability `mask_rate`, the
    embedding of another patch of the same image (drawn uniformly among the others)
    with probability `random_rate`, and otherwise keeps its own embedding while still
    counting as corrupted (BERT's Bernoulli 80/10/10 split).

    Args:
        embeddings: `(batch, num_patches, width)` projected patches, before position
            embeddings are added (so every token keeps its position).
        mask_embedding: the `(width,)` [mask] embedding.
        seed: a `keras.random.SeedGenerator` (required inside compiled functions)
            or an int.
        corrupt_rate, mask_rate, random_rate: the paper's 0.5, 0.8 and 0.1.

    Returns:
        `(corrupted_embeddings, kinds)`, with int32 `kinds` of shape
        `(batch, num_patches)`: `CLEAN`, `MASKED`, `REPLACED` or `KEPT`.

    Example:

    >>> embeddings = keras.random.normal((2, 16, 32))
    >>> corrupted, kinds = corrupt_patch_embeddings(embeddings, keras.ops.zeros((32,)), seed=0)
    >>> int(keras.ops.sum(keras.ops.cast(kinds != CLEAN, "int32")))
    16
    """
    check_corruption_rates(corrupt_rate, mask_rate, random_rate)
    num_patches = embeddings.shape[1]
    if num_patches is None or num_patches < 2:
        raise ValueError(
            f"Masked patch prediction needs a static number of at least 2 patches, "
            f"got embeddings of shape {tuple(embeddings.shape)}."
        )
    if not isinstance(seed, keras.random.SeedGenerator):
        seed = keras.random.SeedGenerator(seed)
    batch = ops.shape(embeddings)[0]
    shape = (batch, num_patches)
    num_corrupt = round(corrupt_rate * num_patches)
    if corrupt_rate > 0:
        num_corrupt = max(1, num_corrupt)

    # A position's rank in a random permutation picks an exact count per image.
    rank = ops.argsort(ops.argsort(keras.random.uniform(shape, seed=seed), axis=1), axis=1)
    chosen = rank < num_corrupt
    draw = keras.random.uniform(shape, seed=seed)
    kinds = ops.where(
        draw < mask_rate, MASKED, ops.where(draw < mask_rate + random_rate, REPLACED, KEPT)
    )
    kinds = ops.where(chosen, kinds, CLEAN)

    # Adding 1..N-1 modulo N gives a uniformly drawn other position.
    offset = keras.random.randint(shape, 1, num_patches, seed=seed)
    other = (ops.arange(num_patches)[None, :] + offset) % num_patches
    other = ops.broadcast_to(ops.expand_dims(other, -1), ops.shape(embeddings))
    replacement = ops.take_along_axis(embeddings, other, axis=1)

    mask = ops.cast(mask_embedding, embeddings.dtype)[None, None, :]
    kind = ops.expand_dims(kinds, -1)
    corrupted = ops.where(kind == MASKED, mask, embeddings)
    corrupted = ops.where(kind == REPLACED, replacement, corrupted)
    return corrupted, ops.cast(kinds, "int32")


@serializable
class PatchCorruption(keras.layers.Layer):
    """Holds the learned [mask] embedding and corrupts patch embeddings with it.

    Calls `corrupt_patch_embeddings` with the layer's own seed generator, so every
    call draws new corruptions, reproducibly from `seed`. Corrupts in training and
    inference alike: the prediction task needs corrupted positions to be scored.

    Example:

    >>> layer = PatchCorruption(seed=1)
    >>> corrupted, kinds = layer(keras.random.normal((2, 16, 32)))
    >>> tuple(corrupted.shape), tuple(kinds.shape)
    ((2, 16, 32), (2, 16))
    """

    def __init__(self, corrupt_rate=0.5, mask_rate=0.8, random_rate=0.1, seed=None, **kwargs):
        super().__init__(**kwargs)
        check_corruption_rates(corrupt_rate, mask_rate, random_rate)
        self.corrupt_rate = float(corrupt_rate)
        self.mask_rate = float(mask_rate)
        self.random_rate = float(random_rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def build(self, input_shape):
        self.mask_embedding = self.add_weight(
            name="mask_embedding",
            shape=(input_shape[-1],),
            initializer=keras.initializers.RandomNormal(stddev=0.02),
        )

    def call(self, embeddings):
        return corrupt_patch_embeddings(
            embeddings, self.mask_embedding, self.seed_generator,
            self.corrupt_rate, self.mask_rate, self.random_rate,
        )

    def compute_output_spec(self, embeddings):
        return (
            keras.KerasTensor(embeddings.shape, embeddings.dtype),
            keras.KerasTensor(embeddings.shape[:-1], "int32"),
        )

    def get_config(self):
        return {
            **super().get_config(),
            "corrupt_rate": self.corrupt_rate,
            "mask_rate": self.mask_rate,
            "random_rate": self.random_rate,
            "seed": self.seed,
        }


def masked_patch_loss(targets, logits, corrupted):
    """Softmax cross-entropy averaged over the corrupted positions only.

    Args:
        targets: int `(batch, num_patches)` colour codes.
        logits: `(batch, num_patches, num_classes)`.
        corrupted: `(batch, num_patches)`, true (or 1) where a patch was corrupted.

    Under `tf.distribute` the value is scaled for summing over replicas, as Keras'
    own losses are.

    Example:

    >>> targets = keras.ops.zeros((1, 2), "int32")
    >>> logits = keras.ops.zeros((1, 2, 8))
    >>> round(float(masked_patch_loss(targets, logits, keras.ops.array([[1, 0]]))), 4)
    2.0794
    """
    loss = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="mean_with_sample_weight", dtype="float32"
    )
    return loss(targets, ops.cast(logits, "float32"), sample_weight=ops.cast(corrupted, "float32"))


def _encoder_parts(encoder):
    """The encoder's `ViTParts`, or a `ValueError` when it cannot serve MPP."""
    try:
        parts = vit_parts(encoder)
    except ValueError as error:
        raise ValueError(f"MaskedPatchPrediction needs a keras_vit.ViT encoder. {error}") from None
    if parts.stem is not None:
        stem = [layer.name for layer in parts.stem.layers]
        raise ValueError(
            f"MaskedPatchPrediction needs patches cut from the images themselves, so that "
            f"a corrupted patch hides its colour; {encoder.name!r} computes them with "
            f"{stem} first (a hybrid). Use a plain ViT encoder."
        )
    if parts.rope is not None:
        raise ValueError(
            f"MaskedPatchPrediction runs the encoder's blocks without a rotary position "
            f"table; {encoder.name!r} was built with rope=True (EVA-02). Pretrain an encoder "
            "built without rope."
        )
    if not parts.patches.flatten:
        raise ValueError(
            f"MaskedPatchPrediction needs an encoder of one image size; {encoder.name!r} "
            "was built with dynamic_image_size=True. Pretrain one built without it (its "
            "weights then load into a dynamic model: model.set_weights(encoder.get_weights()))."
        )
    return parts


@serializable
class MaskedPatchPrediction(keras.Model):
    """Masked patch prediction around a keras-vit encoder (paper section 4.6).

    Patches are projected by the encoder's `patch_encoder`, corrupted by
    `PatchCorruption`, given their position embeddings, and run through the
    encoder's blocks; a linear `mpp_head` predicts every patch's mean-colour code
    from its output token. The loss (`masked_patch_loss`) and the `accuracy` metric
    cover the corrupted patches only, so `fit` needs images alone: compile with an
    optimizer and no loss.

    `model.encoder` is the encoder itself, sharing every weight: save it with
    `model.encoder.save("encoder.keras")` and fine-tune or few-shot evaluate it like
    any `keras_vit.ViT`.

    Args:
        encoder: a model built by `keras_vit.ViT` (any head, pooling or
            position embedding; not a hybrid, whose ResNet would see every pixel).
        bits: bits per colour channel of the targets (3: 512 classes for RGB).
        corrupt_rate, mask_rate, random_rate: corruption proportions, the
            paper's 0.5, 0.8 and 0.1 (see `corrupt_patch_embeddings`).
        seed: seed of the corruption draws.

    Calling the model returns a dict: `logits` `(batch, num_patches, classes)`,
    `targets` `(batch, num_patches)` and `corrupted` `(batch, num_patches)` (0/1).

    Example:

    >>> import numpy as np
    >>> from keras_vit import ViT
    >>> encoder = ViT(image_size=16, patch_size=4, hidden_dim=32, num_layers=1,
    ...               num_heads=2, mlp_dim=64, include_top=False)
    >>> model = MaskedPatchPrediction(encoder, seed=0)
    >>> model.compile(optimizer="adam")
    >>> images = np.random.uniform(-1, 1, (8, 16, 16, 3)).astype("float32")
    >>> history = model.fit(images, batch_size=4, epochs=1, verbose=0)
    >>> sorted(history.history)
    ['accuracy', 'loss']
    """

    def __init__(
        self, encoder, bits=3, corrupt_rate=0.5, mask_rate=0.8, random_rate=0.1, seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        parts = _encoder_parts(encoder)
        self.encoder = encoder
        self.bits = check_positive_int("bits", bits)
        rows, cols = parts.grid_size
        self.num_patches = rows * cols
        self.hidden_dim = parts.patch_encoder.hidden_dim
        self.channels = encoder.input_shape[-1]
        # The encoder's input units, in which the targets' colours are read; None for
        # [-1, 1], which needs no mapping on each training step.
        preprocessing = model_preprocessing(encoder)
        self.preprocessing = None if preprocessing == DEFAULT else preprocessing
        self.corruption = PatchCorruption(
            corrupt_rate, mask_rate, random_rate, seed=seed, name="corruption"
        )
        self.head = keras.layers.Dense(
            2 ** (self.bits * self.channels), kernel_initializer="zeros", dtype="float32",
            name="mpp_head",
        )
        self.accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        self.build(encoder.input_shape)

    def build(self, input_shape):
        token_shape = (None, self.num_patches, self.hidden_dim)
        self.corruption.build(token_shape)
        self.head.build(token_shape)

    def call(self, images, training=False):
        # The encoder's layers are reached through it (not kept as attributes), so
        # each weight is saved once, under the encoder.
        parts = self.parts
        patches = parts.patches(images)
        targets = mean_color_codes(patches, self.channels, self.bits, self.preprocessing)
        embeddings, kinds = self.corruption(parts.patch_embedding(patches))
        table = parts.position_table()
        x = embeddings if table is None else embeddings + ops.cast(table, embeddings.dtype)
        for layer in parts.encoder:
            x = layer(x, training=training)
        # Tokens in front of the patches (the class token) predict nothing.
        logits = self.head(x[:, -self.num_patches :])
        return {
            "logits": logits,
            "targets": targets,
            "corrupted": ops.cast(kinds != CLEAN, "float32"),
        }

    @property
    def parts(self):
        """The encoder's `ViTParts`."""
        return vit_parts(self.encoder)

    def kernels(self):
        """The matrix kernels weight decay applies to: the encoder's and the head's."""
        return (*self.parts.kernels(), self.head.kernel)

    def compile(self, optimizer="adam", loss=None, **kwargs):
        if loss is not None:
            raise ValueError(
                f"MaskedPatchPrediction computes its own loss; compile it without "
                f"loss= (got loss={loss!r})."
            )
        if kwargs.get("metrics") or kwargs.get("weighted_metrics"):
            raise ValueError(
                "MaskedPatchPrediction reports its own masked-patch accuracy; compile it "
                "without metrics=."
            )
        super().compile(optimizer=optimizer, **kwargs)

    def compile_from_config(self, config):
        # Keras skips (with a warning) models whose compile() is overridden.
        self.compile(**keras.saving.deserialize_keras_object(config))
        self.optimizer.build(self.trainable_variables)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        # Labels that come with the images are not used: the images are the targets.
        return masked_patch_loss(y_pred["targets"], y_pred["logits"], y_pred["corrupted"])

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        self.accuracy.update_state(
            y_pred["targets"], y_pred["logits"], sample_weight=y_pred["corrupted"]
        )
        return self.get_metrics_result()

    def get_config(self):
        return {
            "name": self.name,
            "encoder": keras.saving.serialize_keras_object(self.encoder),
            "bits": self.bits,
            "corrupt_rate": self.corruption.corrupt_rate,
            "mask_rate": self.corruption.mask_rate,
            "random_rate": self.corruption.random_rate,
            "seed": self.corruption.seed,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["encoder"] = keras.saving.deserialize_keras_object(config["encoder"])
        return cls(**config)
