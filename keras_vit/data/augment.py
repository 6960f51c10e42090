"""Augmentation: the AugReg levels and Keras preprocessing layers inside `tf.data`.

Keras layers draw their randomness from a `SeedGenerator`; `PositionSeeds` replaces it by
seeds derived from the position in the stream, so augmentations are a pure function of
`(seed, position)` and a resumed run sees exactly the batches of an uninterrupted one.
"""

import contextlib
import functools
import logging
import random

import keras
import tensorflow as tf

from keras_vit.utils import keras_compat
from keras_vit.utils.checks import check_choice
from keras_vit.utils.extras import optional_import

logger = logging.getLogger("keras_vit")
# keras-cv layers that mix the images of a batch in an order from `tf.random.shuffle`.
STATEFUL_KERAS_CV = ("MixUp", "CutMix", "FourierMix", "Mosaic")

# AugReg levels (Steiner et al. 2021, big_vision configs/vit_i21k.py):
# name -> ((RandAugment num_ops, magnitude) or None, MixUp alpha or None).
AUGREG_LEVELS = {
    "none": (None, None),
    "light1": ((2, 0), None),
    "light2": ((2, 10), 0.2),
    "medium1": ((2, 15), 0.2),
    "medium2": ((2, 15), 0.5),
    "strong1": ((2, 20), 0.5),
    "strong2": ((2, 20), 0.8),
}
# RandAugment magnitudes are on the 0-30 scale of the RandAugment paper; Keras' layer
# takes a strength in [0, 1].
RANDAUGMENT_MAX_MAGNITUDE = 30.0


class PositionSeeds(keras.random.SeedGenerator):
    """Seeds for Keras augmentation layers inside `tf.data`, drawn from the stream position.

    A Keras layer's own `SeedGenerator` is a variable that each call advances: in a
    parallel `map` its draws depend on scheduling, and after a restart they start over.
    While `at(seed)` is active (during tracing of the map function), each draw is
    `fold_in(seed, k)` for the k-th draw, with `seed` the element's (or batch's) own
    stateless seed: augmentations become a pure function of the position in the stream.
    """

    def __init__(self):  # No state variable: seeds come from the stream.
        self.name = "position_seeds"
        self._seed = None
        self._draws = 0

    @contextlib.contextmanager
    def at(self, seed):
        self._seed, self._draws = seed, 0
        try:
            yield
        finally:
            self._seed = None

    def next(self, ordered=True):
        if self._seed is None:
            raise RuntimeError("Augmentation layers drew a seed outside the input pipeline.")
        self._draws += 1
        return tf.random.experimental.stateless_fold_in(self._seed, self._draws)


def seed_from_stream(layers, seeds):
    """Makes `layers` (and their sub-layers) draw randomness from `seeds`.

    Keras layers draw from a `SeedGenerator` (`generator`); keras-cv layers from a
    `tf.random.Generator` (`_random_generator`) and from factor samplers that call
    `tf.random`: each is replaced by stateless draws from `seeds`.
    """
    for layer in layers:
        for sub in keras_compat.sublayers(layer):
            if hasattr(sub, "generator"):
                keras_compat.replace_seed_generator(sub, seeds)
            if is_keras_cv(sub):
                seed_keras_cv_layer(sub, seeds)


def is_keras_cv(layer):
    """Whether `layer` is one of keras-cv's (tested without importing keras-cv)."""
    return type(layer).__module__.startswith("keras_cv.")


class PositionGenerator:
    """keras-cv's `tf.random.Generator` calls, drawn statelessly from `PositionSeeds`."""

    def __init__(self, seeds):
        self.seeds = seeds

    def uniform(self, shape, minval=0, maxval=None, dtype=tf.float32, name=None):
        return tf.random.stateless_uniform(shape, self.seeds.next(), minval, maxval, dtype)

    def normal(self, shape, mean=0.0, stddev=1.0, dtype=tf.float32, name=None):
        return tf.random.stateless_normal(shape, self.seeds.next(), mean, stddev, dtype)

    random_normal = normal  # the name keras-cv's GridMask calls


def position_sampler(sampler, seeds):
    """keras-cv's `FactorSampler` drawing from `seeds` (it calls stateful `tf.random`)."""
    import keras_cv

    class Uniform(keras_cv.core.UniformFactorSampler):
        def __call__(self, shape=(), dtype="float32"):
            return tf.random.stateless_uniform(
                shape, seeds.next(), self.lower, self.upper, dtype=dtype
            )

    class Normal(keras_cv.core.NormalFactorSampler):
        def __call__(self, shape=(), dtype="float32"):
            draw = tf.random.stateless_normal(
                shape, seeds.next(), self.mean, self.stddev, dtype=dtype
            )
            return tf.clip_by_value(draw, self.min_value, self.max_value)

    for base, seeded in ((keras_cv.core.UniformFactorSampler, Uniform),
                         (keras_cv.core.NormalFactorSampler, Normal)):
        if type(sampler) is base:
            return seeded(**sampler.get_config())
    return sampler  # ConstantFactorSampler draws nothing.


def seed_keras_cv_layer(layer, seeds):
    import keras_cv

    keras_compat.replace_keras_cv_generator(layer, PositionGenerator(seeds))
    for name, value in list(vars(layer).items()):
        if isinstance(value, keras_cv.core.FactorSampler):
            object.__setattr__(layer, name, position_sampler(value, seeds))


def draws_per_image(layer):
    """Whether `layer` must see one image at a time to draw for each image.

    keras-cv's non-vectorized layers draw one transformation per image inside a
    `map_fn` over the batch; traced once per batch with stateless seeds, every image
    of the batch would get the same draw. They run on each image instead (with that
    image's seed), except those that mix images of a batch (their own `_batch_augment`).
    """
    if not is_keras_cv(layer):
        return False
    import keras_cv

    base = keras_cv.layers.BaseImageAugmentationLayer
    return (
        isinstance(layer, base)
        and not isinstance(layer, keras_cv.layers.VectorizedBaseImageAugmentationLayer)
        and not keras_compat.keras_cv_mixes_batch(layer)
    )


def stream_layers(layers):
    """`(per_image, per_batch)`: the extra augmentations of a stream, as layers it owns.

    keras-cv layers are copied (their random draws are rewired by `seed_from_stream`,
    which must not change the caller's objects) and split by `draws_per_image`.
    """
    layers = [as_layer(layer) for layer in layers]
    layers = [as_layer(keras.layers.serialize(l)) if is_keras_cv(l) else l for l in layers]
    per_image = [layer for layer in layers if draws_per_image(layer)]
    per_batch = [layer for layer in layers if not draws_per_image(layer)]
    for layer in per_batch:
        if is_keras_cv(layer) and type(layer).__name__ in STATEFUL_KERAS_CV:
            logger.warning(
                "keras-cv's %s shuffles with TensorFlow's global random state: a resumed "
                "run's batches will differ from an uninterrupted run's (keras.layers.%s "
                "does not).", type(layer).__name__, type(layer).__name__
            )
    return per_image, per_batch


def _rand_augment(layer, image, seeds):
    """Keras' RandAugment on one image, running only the operations it picks.

    `keras.layers.RandAugment` computes every one of its operations and keeps the picked
    ones with `where`; picking with `switch_case` runs `num_ops` of them, the same
    operations at the same strength, at a fraction of the cost.
    """
    operations = keras_compat.rand_augment_operations(layer)
    for _ in range(layer.num_ops):
        pick = tf.random.stateless_uniform([], seeds.next(), 0, len(operations), dtype=tf.int32)
        branches = [functools.partial(operation, image) for operation in operations]
        image = tf.switch_case(pick, branches)
    return image


def augment_image(layer, image, seeds):
    """`layer` applied to one image, with `seeds` active (RandAugment: only its picks)."""
    if isinstance(layer, keras.layers.RandAugment):
        return _rand_augment(layer, image, seeds)
    return layer(image)


def augmentation_layers(augment="none", randaugment=None, mixup=None, cutmix=None):
    """Returns `(per_image_layers, per_batch_layers)` of Keras augmentation layers.

    Args:
        augment: an AugReg level, one of `AUGREG_LEVELS` (`"none"`, `"light1"` ...
            `"strong2"`); it sets RandAugment and MixUp unless given below.
        randaugment: `(num_ops, magnitude)`, magnitude on the paper's 0-30 scale.
        mixup: MixUp's Beta alpha.
        cutmix: CutMix's Beta alpha (Keras' `factor`).

    Example:

    >>> image_layers, batch_layers = augmentation_layers("light2")
    >>> [type(layer).__name__ for layer in image_layers + batch_layers]
    ['RandAugment', 'MixUp']
    """
    check_choice("augmentation level", augment, AUGREG_LEVELS)
    level_randaugment, level_mixup = AUGREG_LEVELS[augment]
    randaugment = level_randaugment if randaugment is None else randaugment
    mixup = level_mixup if mixup is None else mixup
    per_image, per_batch = [], []
    if randaugment is not None:
        if len(randaugment) != 2 or not 0 <= randaugment[1] <= RANDAUGMENT_MAX_MAGNITUDE:
            raise ValueError(
                f"randaugment must be (num_ops, magnitude) with magnitude in 0-30, "
                f"got {randaugment!r}."
            )
        num_ops, magnitude = randaugment
        per_image.append(
            keras.layers.RandAugment(
                value_range=(0, 255),
                num_ops=int(num_ops),
                factor=magnitude / RANDAUGMENT_MAX_MAGNITUDE,
                dtype="float32",
            )
        )
    if mixup:
        per_batch.append(keras.layers.MixUp(alpha=float(mixup), dtype="float32"))
    if cutmix:
        per_batch.append(keras.layers.CutMix(factor=float(cutmix), dtype="float32"))
    return per_image, per_batch


def as_layer(layer):
    """A Keras layer from a layer or its serialized form (`keras.layers.serialize`).

    Example:

    >>> type(as_layer({"class_name": "RandomTranslation",
    ...                 "config": {"height_factor": 0.1, "width_factor": 0.1}})).__name__
    'RandomTranslation'
    """
    if isinstance(layer, keras.layers.Layer):
        return layer
    if isinstance(layer, dict):
        if str(layer.get("module", "")).startswith("keras_cv"):
            optional_import("keras_cv", f"The augmentation {layer.get('class_name')!r}")
        # A new layer without a seed draws one from Python's `random`; that draw must not
        # move the run's seeded stream (the model is initialised after the pipeline is
        # made), and the layer's seed is unused: `seed_from_stream` replaces it.
        state = random.getstate()
        try:
            # Keras finds its own classes through the module, which hand-written configs omit.
            return keras.layers.deserialize({"module": "keras.layers", **layer})
        except (TypeError, ValueError) as error:
            raise ValueError(f"Augmentation {layer!r} is not a Keras layer: {error}") from None
        finally:
            random.setstate(state)
    raise ValueError(
        f"Augmentations must be Keras layers or their serialized dicts, got {layer!r}."
    )
