"""Classification losses of the paper, as Keras losses (any backend)."""

import keras
from keras import ops

from keras_vit.utils.serialization import serializable


@serializable
class SigmoidCrossEntropy(keras.losses.Loss):
    """Sigmoid cross-entropy summed over classes, averaged over examples.

    The paper pre-trains with it (big_vision's `sigmoid_xent`), with the head bias
    initialised to -10 so that every class starts near probability 0. Keras'
    `BinaryCrossentropy` averages over classes instead, which divides the loss (and,
    before clipping, the gradients) by the number of classes.

    Example:

    >>> loss = SigmoidCrossEntropy()
    >>> round(float(loss(keras.ops.array([[1.0, 0.0]]), keras.ops.array([[0.0, 0.0]]))), 4)
    1.3863
    """

    def __init__(self, name="sigmoid_cross_entropy", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        y_pred = ops.cast(y_pred, "float32")
        y_true = ops.cast(y_true, "float32")
        per_class = ops.binary_crossentropy(y_true, y_pred, from_logits=True)
        return ops.sum(per_class, axis=-1)
