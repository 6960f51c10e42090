"""The closed-form ridge probe of few-shot linear evaluation.

Features are whitened with the training mean and standard deviation, extended by a
constant bias feature and regressed onto {-1, 1} one-hot targets by closed-form ridge
regression; the arg-max of the outputs is the prediction (big_vision
`evaluators/fewshot_lsr.py`). Everything runs in float64 numpy.
"""

import numpy as np

from keras_vit.utils.checks import check_positive_number

BIAS_FEATURE = 100.0  # large, so the bias is almost unregularised
WHITEN_EPSILON = 1e-5
DEFAULT_L2 = 2.0**10


def feature_matrix(features, name):
    """`features` as a float64 `(examples, features)` array; `ValueError` naming `name`
    if it is not 2-D or holds NaN or infinite values.

    Example:

    >>> feature_matrix([[1, 2], [3, 4]], "train features").dtype
    dtype('float64')
    """
    features = np.asarray(features, dtype=np.float64)
    if features.ndim != 2:
        raise ValueError(f"{name} must be 2-D (examples, features), got shape {features.shape}.")
    if not np.all(np.isfinite(features)):
        raise ValueError(f"{name} contain NaN or infinite values.")
    return features


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
        x = feature_matrix(features, "train features")
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
        scale = 1.0 / (self._eigs + check_positive_number("l2", l2))
        return (self._left * scale) @ self._right

    def decision_function(self, features, l2=DEFAULT_L2):
        """Regression outputs `(N, classes)` for raw (unwhitened) features."""
        x = feature_matrix(features, "features")
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
