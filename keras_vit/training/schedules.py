"""Learning-rate schedules of the paper: linear warmup, then linear or cosine decay."""

import math

import keras
from keras import ops

from keras_vit.utils.checks import check_choice, check_positive_int
from keras_vit.utils.serialization import serializable

DECAYS = ("linear", "cosine", "constant")


@serializable
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to `learning_rate` over `warmup_steps`, then decay.

    With `u` the optimizer update and `p = clip((u - warmup_steps) / (total_steps -
    warmup_steps), 0, 1)` the decay progress, the rate is
    `learning_rate * min(1, u / warmup_steps) * d(p)` (big_vision's convention) where
    `d` is `"linear"`: `end + (1 - end) * (1 - p)` with `end = end_learning_rate /
    learning_rate` (the paper decays to 1e-5), `"cosine"`: `(1 + cos(pi * p)) / 2`, or
    `"constant"`: 1.

    Keras optimizers call schedules with their micro-step counter when they accumulate
    gradients; `accumulation_steps` turns it into the update `u = step //
    accumulation_steps`, so the schedule reads in optimizer updates either way.

    Example:

    >>> schedule = WarmupDecay(1e-3, total_steps=100, warmup_steps=10, decay="cosine")
    >>> round(float(schedule(5)), 6), round(float(schedule(55)), 6)
    (0.0005, 0.0005)
    """

    def __init__(
        self,
        learning_rate,
        total_steps,
        warmup_steps=0,
        decay="linear",
        end_learning_rate=1e-5,
        accumulation_steps=1,
    ):
        check_choice("decay", decay, DECAYS)
        if not 0 <= warmup_steps < total_steps:
            raise ValueError(
                f"warmup_steps ({warmup_steps}) must be in [0, total_steps={total_steps})."
            )
        check_positive_int("accumulation_steps", accumulation_steps)
        self.learning_rate = float(learning_rate)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.end_learning_rate = float(end_learning_rate)
        self.accumulation_steps = int(accumulation_steps)

    def __call__(self, step):
        update = ops.cast(ops.floor_divide(step, self.accumulation_steps), "float32")
        warmup = (
            ops.minimum(1.0, update / self.warmup_steps) if self.warmup_steps else 1.0
        )
        progress = ops.clip(
            (update - self.warmup_steps) / (self.total_steps - self.warmup_steps), 0.0, 1.0
        )
        if self.decay == "linear":
            end = self.end_learning_rate / self.learning_rate
            decay = end + (1.0 - end) * (1.0 - progress)
        elif self.decay == "cosine":
            decay = 0.5 * (1.0 + ops.cos(math.pi * progress))
        else:
            decay = 1.0
        return self.learning_rate * warmup * decay

    def get_config(self):
        return {
            "learning_rate": self.learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "decay": self.decay,
            "end_learning_rate": self.end_learning_rate,
            "accumulation_steps": self.accumulation_steps,
        }
