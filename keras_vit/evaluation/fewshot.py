"""Few-shot linear evaluation: the paper's measure of a frozen representation.

Shots are drawn per class with a seed, for several shot counts and seeds; each draw
fits the ridge probe (`keras_vit.evaluation.ridge`) on frozen features
(`keras_vit.evaluation.features`) and scores it on the test split, with a fixed L2
strength or one chosen per shot count on a held-out part of the train split.
`fewshot_evaluate` works on features, `evaluate_model` on images, `evaluate_source`
on an image source named by a `FewshotConfig` (`keras-vit fewshot`).
"""

import dataclasses
import math
import numbers
from typing import Optional

import numpy as np

from keras_vit.evaluation.features import extract_with, representation_model
from keras_vit.evaluation.ridge import DEFAULT_L2, RidgeProbe, feature_matrix
from keras_vit.models.naflex_mode import naflex_budget, naflex_twin
from keras_vit.models.preprocessing import model_preprocessing
from keras_vit.utils.checks import check_in_range, check_positive_int, check_positive_number

# Names this module held before it was split (`fewshot.format_table`, ...) stay importable.
from keras_vit.evaluation.features import extract_features  # noqa: F401
from keras_vit.evaluation.fewshot_report import format_table, save_results  # noqa: F401
from keras_vit.evaluation.ridge import (  # noqa: F401
    BIAS_FEATURE,
    WHITEN_EPSILON,
    linear_fewshot_accuracy,
)

L2_GRID = tuple(2.0**i for i in range(-10, 20))


def _class_permutations(labels, seed):
    rng = np.random.default_rng(seed)
    return {c: rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)}


def _take_shots(permutations, shots, holdout_fraction):
    """First `shots` of each class's permutation, and its last `holdout_fraction`."""
    chosen, held_out = [], []
    for c, indices in permutations.items():
        n_holdout = math.ceil(holdout_fraction * len(indices))
        available = len(indices) - n_holdout
        if available < shots:
            where = (
                f" outside the {n_holdout} held out to choose l2" if n_holdout else ""
            )
            raise ValueError(
                f"Class {c} has {available} training example(s){where}, fewer than "
                f"the {shots} shots asked for."
            )
        chosen.append(indices[:shots])
        held_out.append(indices[len(indices) - n_holdout:])
    return np.concatenate(chosen), np.concatenate(held_out)


def sample_shots(labels, shots, *, seed=0):
    """Indices of exactly `shots` examples of each class, drawn with `seed`.

    Each class's examples are permuted by a generator seeded with `seed` and the
    first `shots` are taken, so for one seed smaller samples are subsets of larger
    ones (as big_vision draws them). A class with fewer examples is a ValueError.

    Example:

    >>> idx = sample_shots([0, 0, 0, 1, 1, 1], 2, seed=0)
    >>> sorted(np.asarray([0, 0, 0, 1, 1, 1])[idx].tolist())
    [0, 0, 1, 1]
    """
    shots = _check_shots([shots])[0]
    labels = np.asarray(labels).reshape(-1)
    return _take_shots(_class_permutations(labels, seed), shots, 0.0)[0]


def _check_shots(shots):
    shots = list(shots)
    if not shots or any(
        not isinstance(s, numbers.Integral) or isinstance(s, bool) or s < 1 for s in shots
    ):
        raise ValueError(f"shots must be positive integers, got {shots!r}.")
    return sorted(set(int(s) for s in shots))


def _l2_candidates(l2):
    if isinstance(l2, str):
        if l2 != "sweep":
            raise ValueError(f"l2 must be a positive number, a list of them or 'sweep', got {l2!r}.")
        return list(L2_GRID)
    if isinstance(l2, numbers.Real):
        return [check_positive_number("l2", l2)]
    candidates = [check_positive_number("l2", value) for value in l2]
    if not candidates:
        raise ValueError("l2 is an empty list: give at least one L2 strength.")
    return candidates


def fewshot_evaluate(
    train_features,
    train_labels,
    test_features,
    test_labels,
    *,
    shots=(1, 5, 10, 25),
    seeds=3,
    l2=DEFAULT_L2,
    holdout_fraction=0.2,
):
    """Few-shot linear accuracy for several shot counts and seeds.

    For each seed, each class's training examples are permuted and the first
    `shots` are the few-shot training set. With a single `l2` it is used for every
    shot count. With several (a list, or `"sweep"` for `L2_GRID`, 2**-10 ... 2**19),
    the last `holdout_fraction` of each class's permutation is held out, never
    sampled as a shot, and each shot count gets the `l2` with the best held-out
    accuracy averaged over seeds; the test split is only used for the final score.

    Args:
        train_features, train_labels: the pool to draw shots from.
        test_features, test_labels: the evaluation set.
        shots: shot counts (examples per class).
        seeds: number of seeds (0, 1, ...) or a list of seeds.
        l2: a positive number, a list of candidates, or `"sweep"`.
        holdout_fraction: part of each class held out when choosing `l2`.

    Returns:
        A JSON-serialisable dict: `shots`, `seeds`, per shot count (lists aligned
        with `shots`) `l2`, `accuracy` (one per seed), `mean`, `std` (over seeds,
        ddof=0); `num_classes`, `num_train`, `num_test`, and with a sweep
        `l2_candidates` and `holdout_accuracy` (per shot count, per candidate).

    Example:

    >>> rng = np.random.default_rng(0)
    >>> labels = np.repeat(np.arange(4), 30)
    >>> x = rng.normal(size=(4, 16))[labels] * 3 + rng.normal(size=(120, 16))
    >>> result = fewshot_evaluate(x[::2], labels[::2], x[1::2], labels[1::2], shots=(1, 5))
    >>> result["shots"], len(result["accuracy"][0])
    ([1, 5], 3)
    """
    shots = _check_shots(shots)
    seeds = list(range(seeds)) if isinstance(seeds, numbers.Integral) else list(seeds)
    if not seeds:
        raise ValueError("seeds must be a positive count or a non-empty list of seeds.")
    candidates = _l2_candidates(l2)
    sweep = len(candidates) > 1
    if sweep:
        check_in_range("holdout_fraction", holdout_fraction, "(0, 1)", " to choose l2")
    train_features = feature_matrix(train_features, "train features")
    test_features = feature_matrix(test_features, "test features")
    train_labels = np.asarray(train_labels).reshape(-1)
    test_labels = np.asarray(test_labels).reshape(-1)
    if len(train_labels) != len(train_features) or len(test_labels) != len(test_features):
        raise ValueError(
            f"Got {len(train_features)} train features with {len(train_labels)} labels and "
            f"{len(test_features)} test features with {len(test_labels)} labels: "
            "expected one label per example."
        )

    permutations = [_class_permutations(train_labels, seed) for seed in seeds]
    result = dict(
        shots=shots, seeds=seeds, l2=[], accuracy=[], mean=[], std=[],
        num_classes=int(len(np.unique(train_labels))),
        num_train=int(len(train_labels)), num_test=int(len(test_labels)),
    )
    if sweep:
        result.update(l2_candidates=candidates, holdout_fraction=holdout_fraction, holdout_accuracy=[])
    for count in shots:
        probes, holdout_scores = [], []
        for perms in permutations:
            chosen, held_out = _take_shots(perms, count, holdout_fraction if sweep else 0.0)
            probe = RidgeProbe(train_features[chosen], train_labels[chosen])
            probes.append(probe)
            if sweep:
                holdout_scores.append([
                    probe.accuracy(train_features[held_out], train_labels[held_out], value)
                    for value in candidates
                ])
        if sweep:
            holdout_mean = np.mean(holdout_scores, axis=0)
            best = candidates[int(np.argmax(holdout_mean))]
            result["holdout_accuracy"].append(holdout_mean.tolist())
        else:
            best = candidates[0]
        accuracies = [probe.accuracy(test_features, test_labels, best) for probe in probes]
        result["l2"].append(best)
        result["accuracy"].append(accuracies)
        result["mean"].append(float(np.mean(accuracies)))
        result["std"].append(float(np.std(accuracies)))
    return result


def evaluate_model(model, train_data, test_data, *, batch_size=256, layer=None, verbose=0, **kwargs):
    """Extracts features of both splits with `model` and runs `fewshot_evaluate`.

    `train_data` and `test_data` are `(images, labels)` array pairs or
    `tf.data.Dataset`s of `(images, labels)`; `kwargs` go to `fewshot_evaluate`.

    Example:

    >>> import keras_vit
    >>> vit = keras_vit.ViT(image_size=8, patch_size=4, hidden_dim=16, num_layers=1,
    ...                     num_heads=2, mlp_dim=32, channels=1)
    >>> rng = np.random.default_rng(0)
    >>> labels = np.arange(20) % 2
    >>> images = rng.uniform(-1, 1, (20, 8, 8, 1)).astype("float32")
    >>> result = evaluate_model(vit, (images, labels), (images, labels), shots=(2,))
    >>> result["shots"]
    [2]
    """
    extractor = representation_model(model, layer)
    splits = []
    for name, data in (("train_data", train_data), ("test_data", test_data)):
        if isinstance(data, tuple):
            if len(data) != 2:
                raise ValueError(f"{name} must be (images, labels) or a tf.data.Dataset.")
            data, labels = data
        else:
            labels = None
        features, labels = extract_with(
            extractor, data, labels, batch_size=batch_size, verbose=verbose
        )
        if labels is None:
            raise ValueError(f"{name} has no labels: yield (images, labels) batches.")
        splits += [features, labels]
    return fewshot_evaluate(*splits, **kwargs)


@dataclasses.dataclass
class FewshotConfig:
    """A few-shot evaluation of a model on an image source; `recipes/fewshot.py` is one.

    `data` is a `keras_vit.data.load_source` specification whose train split gives the
    shots and whose test split (or `test_data`) is scored; `classes` selects some of its
    classes (e.g. `"5-9"`). `shots`, `seeds`, `l2` and `holdout_fraction` are those of
    `fewshot_evaluate`; `sweep=True` chooses `l2` per shot count from `L2_GRID`.
    Images are resized to the model's input size (`crop_fraction=1`, as big_vision's
    few-shot evaluators do, or a central crop) and passed through the model
    `batch_size` at a time; `layer` picks the representation (see `representation_model`).
    A NaFlex model (`ViT(naflex=True)`) sees each whole image at its own aspect, resized
    to the largest patch grid within `max_num_patches` (default: the patches of its
    `image_size`). `out` is where `save_results` writes.

    Example:

    >>> FewshotConfig(data="digits", classes="5-9", shots=(1, 5)).validate().shots
    (1, 5)
    """

    data: str = "digits"
    test_data: Optional[str] = None
    classes: Optional[str] = None
    shots: tuple = (1, 5, 10, 25)
    seeds: int = 3
    l2: float = DEFAULT_L2
    sweep: bool = False
    holdout_fraction: float = 0.2
    batch_size: int = 256
    crop_fraction: float = 1.0
    layer: Optional[str] = None
    max_num_patches: Optional[int] = None
    out: str = "runs/fewshot"

    def __post_init__(self):
        self.shots = tuple(self.shots)

    def validate(self):
        """Raises `ValueError` naming the first field with a bad value."""
        self.shots = tuple(_check_shots(self.shots))
        check_positive_int("seeds", self.seeds)
        check_positive_number("l2", self.l2)
        check_positive_int("batch_size", self.batch_size)
        check_in_range("crop_fraction", self.crop_fraction, "(0, 1]")
        check_positive_int("max_num_patches", self.max_num_patches, optional=True)
        if self.sweep:
            check_in_range("holdout_fraction", self.holdout_fraction, "(0, 1)", " to choose l2")
        if self.classes is not None:
            from keras_vit.data import parse_classes

            parse_classes(self.classes)
        return self


def evaluate_source(model, config, *, verbose=0):
    """Few-shot accuracy of `model` on the image source `config` names.

    Loads the train and test splits of `config.data` (TensorFlow's `tf.data`, any Keras
    backend), selects `config.classes`, preprocesses images to the model's input size
    and channels as the eval pipeline does, and returns `evaluate_model`'s result with
    the source's name and class names added.

    Example:

    >>> import keras_vit
    >>> vit = keras_vit.ViT(image_size=8, patch_size=4, hidden_dim=16, num_layers=1,
    ...                     num_heads=2, mlp_dim=32, channels=1)
    >>> config = FewshotConfig(data="digits", classes="5-9", shots=(1, 5))
    >>> evaluate_source(vit, config)["class_names"]
    ['5', '6', '7', '8', '9']
    """
    import tensorflow as tf  # tf.data, imported only when used

    from keras_vit import data as vit_data

    config.validate()
    if config.test_data is None and vit_data.spec_split(config.data):
        raise ValueError(
            f"data={config.data!r} names its split: set test_data to the split to score."
        )
    arch = getattr(model, "architecture", None)
    if arch is not None and arch.naflex:  # each image at its own aspect, one per row
        model = naflex_twin(model)
        size, channels = None, arch.channels
        naflex = vit_data.NaFlexLayout(
            arch.patch_size, config.max_num_patches or naflex_budget(model))
    else:
        _, size, width, channels = model.input_shape
        if size != width or size is None:
            raise ValueError(
                f"Few-shot evaluation needs a model with a fixed square input, got {model.input_shape}."
            )
        naflex = None
    splits = []
    for spec, split in ((config.data, "train"), (config.test_data or config.data, "test")):
        source = vit_data.load_source(spec, split)
        labels = tf.range(source.num_classes)
        if config.classes is not None:
            source = vit_data.select_classes(source, config.classes)
            labels = tf.constant(vit_data.parse_classes(config.classes))
        dataset = vit_data.eval_dataset(
            source, size, config.batch_size, channels=channels,
            crop_fraction=config.crop_fraction, preprocessing=model_preprocessing(model),
            naflex=naflex,
        )
        # The source's own labels (5-9, not 0-4), so that results and errors name them.
        splits.append(dataset.map(lambda x, y: (x, tf.gather(labels, tf.argmax(y, axis=-1)))))
    result = evaluate_model(
        model, *splits, batch_size=config.batch_size, layer=config.layer, verbose=verbose,
        shots=config.shots, seeds=config.seeds, l2="sweep" if config.sweep else config.l2,
        holdout_fraction=config.holdout_fraction,
    )
    result.update(data=source.name, class_names=source.class_names)
    return result


def __getattr__(name):
    # `fewshot.plot_fewshot` (now `keras_vit.figures.plot_fewshot`, drawn by
    # `keras_vit.evaluation.charts`) without importing matplotlib with this module.
    if name == "plot_fewshot":
        from keras_vit.evaluation import charts

        return charts.plot_fewshot
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
