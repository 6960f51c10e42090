"""Few-shot linear evaluation: the paper's measure of a frozen representation.

Features of a frozen model (the pooled or `pre_logits` output) are whitened with the
few-shot training mean and standard deviation, extended by a constant bias feature
and regressed onto {-1, 1} one-hot targets by closed-form ridge regression; the test
accuracy of the arg-max is the score (big_vision `evaluators/fewshot_lsr.py`).
Shots are drawn per class with a seed, for several shot counts and seeds, with a
fixed L2 strength or one chosen per shot count on a held-out part of the train split.
"""

import dataclasses
import json
import math
import numbers
import os
from typing import Optional

import keras
import numpy as np

from keras_vit.models.vit import vit_parts

BIAS_FEATURE = 100.0  # large, so the bias is almost unregularised
WHITEN_EPSILON = 1e-5
DEFAULT_L2 = 2.0**10
L2_GRID = tuple(2.0**i for i in range(-10, 20))


def feature_model(model, layer=None):
    """Returns a `keras.Model` from `model`'s input to its representation.

    The representation is the output of the layer named `layer` if given, else of a
    ViT's `pre_logits` (the representation layer) when it has one, else of its
    `pool`. A model that outputs `(batch, features)` itself (e.g. a ViT built with
    `include_top=False`, or another encoder) is used as it is.

    Example:

    >>> vit = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32,
    ...                     num_layers=2, num_heads=4, mlp_dim=64)
    >>> feature_model(vit).output.shape
    (None, 32)
    """
    if layer is None:
        try:
            parts = vit_parts(model)
            found = parts.pool if parts.pre_logits is None else parts.pre_logits
        except ValueError:  # another encoder
            found = None
        if found is None:
            if len(model.outputs) == 1 and len(model.outputs[0].shape) == 2:
                return model
            raise ValueError(
                f"Model {model.name!r} has no 'pre_logits' or 'pool' layer and does not "
                "output pooled features: pass layer=NAME, or build it with pooling=True."
            )
    else:
        names = [sub.name for sub in getattr(model, "layers", [])]
        if layer not in names:
            raise ValueError(
                f"Model {model.name!r} has no layer {layer!r}: expected one of "
                f"{', '.join(names)}."
            )
        found = model.get_layer(layer)
    output = found.output
    if len(output.shape) != 2:
        raise ValueError(
            f"Layer {found.name!r} outputs shape {tuple(output.shape)}: few-shot features "
            "must be (batch, features); use the pooled output."
        )
    return keras.Model(model.inputs, output, name=f"{model.name}_features")


def _integer_labels(labels):
    labels = np.asarray(labels)
    if labels.ndim == 2:  # one-hot or soft labels, as training pipelines yield them
        labels = labels.argmax(axis=-1)
    return labels.reshape(-1)


def _batches(data, labels, batch_size):
    if hasattr(data, "as_numpy_iterator"):  # a tf.data.Dataset, without importing tf
        if labels is not None:
            raise ValueError(
                "labels must be None when data is a tf.data.Dataset: the dataset yields "
                "(images, labels) batches itself."
            )
        spec = data.element_spec
        image_spec = spec[0] if isinstance(spec, tuple) else spec
        if len(image_spec.shape) == 3:  # single images: batch them here
            data = data.batch(batch_size)
        for element in data.as_numpy_iterator():
            if isinstance(element, tuple):
                yield element[0], element[1]
            else:
                yield element, None
        return
    images = np.asarray(data)
    if labels is not None and len(labels) != len(images):
        raise ValueError(
            f"Got {len(images)} images but {len(labels)} labels: expected one label per image."
        )
    for start in range(0, len(images), batch_size):
        end = start + batch_size
        yield images[start:end], None if labels is None else np.asarray(labels)[start:end]


def extract_features(model, data, labels=None, *, batch_size=256, layer=None, verbose=0):
    """Computes a model's frozen representation of a set of images.

    Args:
        model: a keras-vit model (any backend); see `feature_model` for which
            layer's output is used.
        data: images as the model takes them (NHWC, scaled with
            `keras_vit.preprocess`), or a `tf.data.Dataset` of image batches or
            `(images, labels)` batches (integer or one-hot labels).
        labels: labels of array `data` (optional), passed through.
        batch_size: images per forward pass (and per batch of an unbatched dataset).
        layer: name of the layer whose output is the representation.
        verbose: 1 shows a progress bar.

    Returns:
        `(features, labels)`: float32 array `(N, D)` and integer labels `(N,)`,
        or None where there are none.

    Example:

    >>> vit = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32,
    ...                     num_layers=2, num_heads=4, mlp_dim=64)
    >>> features, _ = extract_features(vit, np.zeros((3, 32, 32, 3), "float32"))
    >>> features.shape
    (3, 32)
    """
    return _extract(feature_model(model, layer), data, labels, batch_size, verbose)


def _extract(extractor, data, labels, batch_size, verbose):
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    progress = keras.utils.Progbar(None, unit_name="image") if verbose else None
    features, all_labels, full = [], [], None
    for images, batch_labels in _batches(data, labels, int(batch_size)):
        images = np.asarray(images)
        count = len(images)
        full = full or count
        if count < full:  # one input shape per extractor: no retracing or recompiling
            pad = np.zeros((full - count, *images.shape[1:]), images.dtype)
            images = np.concatenate([images, pad])
        outputs = np.asarray(extractor.predict_on_batch(images))
        features.append(outputs[:count].astype("float32"))
        if batch_labels is not None:
            all_labels.append(_integer_labels(batch_labels))
        if progress is not None:
            progress.add(count)
    if progress is not None:
        progress.update(sum(len(f) for f in features), finalize=True)  # ends the line
    if not features:
        raise ValueError("No images to extract features from: data is empty.")
    labels = np.concatenate(all_labels) if all_labels else None
    return np.concatenate(features), labels


def _check_features(features, name):
    features = np.asarray(features, dtype=np.float64)
    if features.ndim != 2:
        raise ValueError(f"{name} must be 2-D (examples, features), got shape {features.shape}.")
    if not np.all(np.isfinite(features)):
        raise ValueError(f"{name} contain NaN or infinite values.")
    return features


def _check_l2(l2):
    if not isinstance(l2, numbers.Real) or not l2 > 0:
        raise ValueError(f"l2 must be a positive number, got {l2!r}.")
    return float(l2)


class RidgeProbe:
    """Closed-form L2-regularised least squares from features to {-1, 1} targets.

    As big_vision's few-shot evaluator: features are whitened with the training
    mean and standard deviation (+1e-5), a constant feature `BIAS_FEATURE` is
    appended, targets are `2 * one_hot - 1`, and the weights
    `(X^T X + l2 I)^-1 X^T Y` are computed from one eigendecomposition of whichever
    of `X^T X` (D x D) or `X X^T` (N x N) is smaller, so any number of `l2` values
    cost one solve. Classes are the distinct training labels; computations run in
    float64.

    Args:
        features: training features `(N, D)`.
        labels: training labels `(N,)`, any integers (e.g. 5..9).

    Example:

    >>> x = np.array([[0.0, 1.0], [1.0, 0.0], [0.1, 0.9], [0.9, 0.2]])
    >>> probe = RidgeProbe(x, [3, 7, 3, 7])
    >>> probe.predict([[0.0, 2.0]], l2=1.0).tolist()
    [3]
    """

    def __init__(self, features, labels):
        x = _check_features(features, "train features")
        labels = np.asarray(labels).reshape(-1)
        if len(labels) != len(x):
            raise ValueError(
                f"Got {len(x)} train features but {len(labels)} labels: expected one per example."
            )
        self.classes, y = np.unique(labels, return_inverse=True)
        if len(self.classes) < 2:
            raise ValueError(
                f"Few-shot training labels hold {len(self.classes)} class(es) "
                f"({self.classes.tolist()}): expected at least 2."
            )
        self.mean = x.mean(axis=0)
        self.std = x.std(axis=0) + WHITEN_EPSILON
        x = self.transform(x)
        targets = 2.0 * np.eye(len(self.classes))[y] - 1.0
        if len(x) >= x.shape[1]:
            # W = Q diag(1 / (eigs + l2)) Q^T X^T Y with X^T X = Q diag(eigs) Q^T.
            self._eigs, q = np.linalg.eigh(x.T @ x)
            self._left, self._right = q, q.T @ (x.T @ targets)
        else:
            # W = X^T (X X^T + l2 I)^-1 Y, the same weights from the N x N system.
            self._eigs, q = np.linalg.eigh(x @ x.T)
            self._left, self._right = x.T @ q, q.T @ targets

    def transform(self, features):
        """Whitens features with the training statistics and appends the bias feature."""
        x = (np.asarray(features, dtype=np.float64) - self.mean) / self.std
        return np.concatenate([x, np.full((len(x), 1), BIAS_FEATURE)], axis=1)

    def weights(self, l2=DEFAULT_L2):
        """The ridge weights `(D + 1, classes)` for L2 strength `l2` (bias row last)."""
        scale = 1.0 / (self._eigs + _check_l2(l2))
        return (self._left * scale) @ self._right

    def decision_function(self, features, l2=DEFAULT_L2):
        """Regression outputs `(N, classes)` for raw (unwhitened) features."""
        x = _check_features(features, "features")
        if x.shape[1] != len(self.mean):
            raise ValueError(
                f"features have {x.shape[1]} dimensions, the probe was fit on {len(self.mean)}."
            )
        return self.transform(x) @ self.weights(l2)

    def predict(self, features, l2=DEFAULT_L2):
        """Predicted labels (from the training labels) for raw features."""
        return self.classes[self.decision_function(features, l2).argmax(axis=1)]

    def accuracy(self, features, labels, l2=DEFAULT_L2):
        """Fraction of `labels` predicted correctly."""
        labels = np.asarray(labels).reshape(-1)
        predictions = self.predict(features, l2)
        if len(labels) != len(predictions):
            raise ValueError(
                f"Got {len(predictions)} test features but {len(labels)} labels: "
                "expected one per example."
            )
        return float(np.mean(predictions == labels))


def linear_fewshot_accuracy(train_features, train_labels, test_features, test_labels, *, l2=DEFAULT_L2):
    """Test accuracy of the closed-form ridge probe fit on the few-shot examples.

    Example:

    >>> rng = np.random.default_rng(0)
    >>> centres = rng.normal(size=(3, 8)) * 5
    >>> labels = np.repeat([0, 1, 2], 5)
    >>> x = centres[labels] + rng.normal(size=(15, 8))
    >>> linear_fewshot_accuracy(x, labels, centres, [0, 1, 2], l2=1.0)
    1.0
    """
    probe = RidgeProbe(train_features, train_labels)
    return probe.accuracy(test_features, test_labels, l2)


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
        return [_check_l2(l2)]
    candidates = [_check_l2(value) for value in l2]
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
    if sweep and not 0 < holdout_fraction < 1:
        raise ValueError(
            f"holdout_fraction must be in (0, 1) to choose l2, got {holdout_fraction!r}."
        )
    train_features = _check_features(train_features, "train features")
    test_features = _check_features(test_features, "test features")
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

    >>> vit = keras_vit.ViT(image_size=8, patch_size=4, hidden_dim=16, num_layers=1,
    ...                     num_heads=2, mlp_dim=32, channels=1)
    >>> rng = np.random.default_rng(0)
    >>> labels = np.arange(20) % 2
    >>> images = rng.uniform(-1, 1, (20, 8, 8, 1)).astype("float32")
    >>> result = evaluate_model(vit, (images, labels), (images, labels), shots=(2,))
    >>> result["shots"]
    [2]
    """
    extractor = feature_model(model, layer)
    splits = []
    for name, data in (("train_data", train_data), ("test_data", test_data)):
        if isinstance(data, tuple):
            if len(data) != 2:
                raise ValueError(f"{name} must be (images, labels) or a tf.data.Dataset.")
            data, labels = data
        else:
            labels = None
        features, labels = _extract(extractor, data, labels, batch_size, verbose)
        if labels is None:
            raise ValueError(f"{name} has no labels: yield (images, labels) batches.")
        splits += [features, labels]
    return fewshot_evaluate(*splits, **kwargs)


@dataclasses.dataclass
class FewshotConfig:
    """A few-shot evaluation of a model on an image source; `recipes/fewshot.py` is one.

    `data` is a `keras_vit.data.pipelines.load_source` specification whose train split gives the
    shots and whose test split (or `test_data`) is scored; `classes` selects some of its
    classes (e.g. `"5-9"`). `shots`, `seeds`, `l2` and `holdout_fraction` are those of
    `fewshot_evaluate`; `sweep=True` chooses `l2` per shot count from `L2_GRID`.
    Images are resized to the model's input size (`crop_fraction=1`, as big_vision's
    few-shot evaluators do, or a central crop) and passed through the model
    `batch_size` at a time; `layer` picks the representation (see `feature_model`).
    `out` is where `save_results` writes.

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
    out: str = "runs/fewshot"

    def __post_init__(self):
        self.shots = tuple(self.shots)

    def validate(self):
        """Raises `ValueError` naming the first field with a bad value."""
        self.shots = tuple(_check_shots(self.shots))
        if not isinstance(self.seeds, numbers.Integral) or isinstance(self.seeds, bool) or self.seeds < 1:
            raise ValueError(f"seeds must be a positive integer, got {self.seeds!r}.")
        _check_l2(self.l2)
        if int(self.batch_size) != self.batch_size or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}.")
        if not 0 < self.crop_fraction <= 1:
            raise ValueError(f"crop_fraction must be in (0, 1], got {self.crop_fraction!r}.")
        if self.sweep and not 0 < self.holdout_fraction < 1:
            raise ValueError(
                f"holdout_fraction must be in (0, 1) to choose l2, got {self.holdout_fraction!r}."
            )
        if self.classes is not None:
            from keras_vit.data.pipelines import parse_classes

            parse_classes(self.classes)
        return self


def evaluate_source(model, config, *, verbose=0):
    """Few-shot accuracy of `model` on the image source `config` names.

    Loads the train and test splits of `config.data` (TensorFlow's `tf.data`, any Keras
    backend), selects `config.classes`, preprocesses images to the model's input size
    and channels as the eval pipeline does, and returns `evaluate_model`'s result with
    the source's name and class names added.

    Example:

    >>> vit = keras_vit.ViT(image_size=8, patch_size=4, hidden_dim=16, num_layers=1,
    ...                     num_heads=2, mlp_dim=32, channels=1)
    >>> config = FewshotConfig(data="digits", classes="5-9", shots=(1, 5))
    >>> evaluate_source(vit, config)["class_names"]
    ['5', '6', '7', '8', '9']
    """
    import tensorflow as tf  # tf.data, imported only when used

    from keras_vit.data import pipelines as vit_data

    config.validate()
    if config.test_data is None and vit_data.spec_split(config.data):
        raise ValueError(
            f"data={config.data!r} names its split: set test_data to the split to score."
        )
    _, height, width, channels = model.input_shape
    if height != width or height is None:
        raise ValueError(
            f"Few-shot evaluation needs a model with a fixed square input, got {model.input_shape}."
        )
    splits = []
    for spec, split in ((config.data, "train"), (config.test_data or config.data, "test")):
        source = vit_data.load_source(spec, split)
        labels = tf.range(source.num_classes)
        if config.classes is not None:
            source = vit_data.select_classes(source, config.classes)
            labels = tf.constant(vit_data.parse_classes(config.classes))
        dataset = vit_data.eval_dataset(
            source, height, config.batch_size, channels=channels, crop_fraction=config.crop_fraction
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


def save_results(runs, out, *, references=None, title="Few-shot linear evaluation"):
    """Writes `fewshot.json`, `fewshot.txt` (the table) and `fewshot.png` under `out`.

    Args:
        runs: `{name: result}` from `fewshot_evaluate` (or a single result).
        out: the output folder (created).
        references: optional `{name: {run name: accuracy}}` rows of the table, drawn as
            dashed lines in the plot (e.g. a fine-tuned model's accuracy).
        title: the plot's title.

    Returns:
        The table (`format_table`).

    Example:

    >>> import tempfile
    >>> result = dict(shots=[1, 5], mean=[0.5, 0.75], std=[0.1, 0.05], l2=[1024.0, 1024.0])
    >>> print(save_results({"pretrained": result}, tempfile.mkdtemp()).splitlines()[0])
    shots | pretrained   | l2
    """
    if "shots" in runs:
        runs = {"accuracy": runs}
    references = references or {}
    os.makedirs(out, exist_ok=True)
    table = format_table(runs, references)
    with open(os.path.join(out, "fewshot.json"), "w") as f:
        json.dump(dict(runs=runs, references=references), f, indent=2)
    with open(os.path.join(out, "fewshot.txt"), "w") as f:
        f.write(table + "\n")
    lines = {
        f"{row} ({name})" if len(values) > 1 else row: accuracy
        for row, values in references.items()
        for name, accuracy in values.items()
    }
    plot_fewshot(runs, os.path.join(out, "fewshot.png"), references=lines, title=title)
    return table


def format_table(runs, references=None):
    """A text table of few-shot results: one row per shot count, one column per run.

    Args:
        runs: `{name: result}` with results from `fewshot_evaluate` (or a single
            result, named "accuracy").
        references: optional `{row name: {column name: accuracy}}` extra rows, e.g.
            a fine-tuned model's accuracy.

    Example:

    >>> result = dict(shots=[1, 5], mean=[0.5, 0.75], std=[0.1, 0.05], l2=[1024.0, 1024.0])
    >>> print(format_table({"pretrained": result}))
    shots | pretrained   | l2
    ------+--------------+-----
        1 | 50.0 ± 10.0% | 2^10
        5 | 75.0 ± 5.0%  | 2^10
    """
    if "shots" in runs:
        runs = {"accuracy": runs}
    references = references or {}
    names = list(runs)
    shots = sorted({s for result in runs.values() for s in result["shots"]})
    show_l2 = len(runs) == 1
    header = ["shots", *names] + (["l2"] if show_l2 else [])
    rows = []
    for count in shots:
        row = [str(count)]
        for result in runs.values():
            if count in result["shots"]:
                i = result["shots"].index(count)
                row.append(f"{100 * result['mean'][i]:.1f} ± {100 * result['std'][i]:.1f}%")
            else:
                row.append("-")
        if show_l2:
            (result,) = runs.values()
            row.append(f"2^{math.log2(result['l2'][result['shots'].index(count)]):g}")
        rows.append(row)
    for label, values in references.items():
        row = [label] + [
            f"{100 * values[name]:.1f}%" if name in values else "-" for name in names
        ]
        rows.append(row + ([""] if show_l2 else []))
    widths = [max(len(r[j]) for r in [header, *rows]) for j in range(len(header))]

    def line(cells):
        text = [cells[0].rjust(widths[0])] + [c.ljust(w) for c, w in zip(cells[1:], widths[1:])]
        return " | ".join(text).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *map(line, rows)])


def plot_fewshot(runs, path, *, references=None, title="Few-shot linear evaluation"):
    """Saves a PNG of accuracy (mean ± std over seeds) against shots per class.

    Args:
        runs: `{name: result}` from `fewshot_evaluate` (or a single result).
        path: the PNG file to write.
        references: optional `{name: accuracy}` drawn as horizontal dashed lines.
        title: the figure title.

    Example:

    >>> import tempfile, os
    >>> result = dict(shots=[1, 5], mean=[0.5, 0.75], std=[0.1, 0.05])
    >>> path = os.path.join(tempfile.mkdtemp(), "fewshot.png")
    >>> plot_fewshot({"pretrained": result}, path)
    """
    import matplotlib

    matplotlib.use("Agg")  # writes files only; needs no display
    import matplotlib.pyplot as plt

    if "shots" in runs:
        runs = {"accuracy": runs}
    figure, axes = plt.subplots(figsize=(5, 3.6))
    all_shots = sorted({s for result in runs.values() for s in result["shots"]})
    for name, result in runs.items():
        axes.errorbar(
            result["shots"], 100 * np.asarray(result["mean"]), yerr=100 * np.asarray(result["std"]),
            marker="o", capsize=3, label=name,
        )
    for index, (name, accuracy) in enumerate((references or {}).items()):
        axes.axhline(100 * accuracy, linestyle="--", color=f"C{len(runs) + index}", label=name)
    axes.set_xscale("log")
    axes.set_xticks(all_shots)
    axes.set_xticklabels([str(s) for s in all_shots])
    axes.minorticks_off()
    axes.set_xlabel("shots per class")
    axes.set_ylabel("test accuracy (%)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
