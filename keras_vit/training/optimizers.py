"""The paper's optimizers: Adam/AdamW with decoupled weight decay on kernels only, SGD."""

import keras

from keras_vit.backend.optimizer import adam_update, clip_by_global_norm, eager_torch
from keras_vit.utils import keras_compat
from keras_vit.utils.checks import check_choice, check_positive_int
from keras_vit.utils.serialization import serializable

OPTIMIZERS = ("adam", "adamw", "sgd")


@serializable
class Adam(keras_compat.UpdateStepHook, keras.optimizers.Adam):
    """`keras.optimizers.Adam`, whose eager step on PyTorch takes fused kernels
    (`keras_vit.backend.optimizer`): the update in one pass over the variables rather
    than Keras' ten, and `global_clipnorm`'s clip in foreach kernels. The same rule,
    arguments, slots and checkpoints; on TensorFlow and JAX, and under `torch.compile`
    (which fuses it), Keras' own step.
    `make_optimizer` builds it for `"adam"` and `"adamw"`.

    Example:

    >>> variable = keras.Variable([1.0, -1.0])
    >>> optimizer = Adam(learning_rate=0.1)
    >>> optimizer.apply([keras.ops.convert_to_tensor([0.5, -0.5])], [variable])
    >>> [round(float(x), 4) for x in keras.ops.convert_to_numpy(variable)]
    [0.9, -0.9]
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        keras_clip = keras_compat.clip_gradients_function(self)

        def clip(grads):
            if eager_torch() and self.global_clipnorm:
                return clip_by_global_norm(grads, self.global_clipnorm)
            return keras_clip(grads)

        # Set on the instance, as `multiworker.clip_summed_gradients` wraps it.
        keras_compat.set_clip_gradients_function(self, clip)

    def update_variables(self, grads, variables, learning_rate):
        if not eager_torch():
            return False
        adam_update(
            [v.value for v in variables], grads, *keras_compat.adam_slots(self, variables),
            step=keras.ops.convert_to_numpy(self.iterations) + 1, learning_rate=learning_rate,
            beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon,
        )
        return True


def decayed_variables(model):
    """The variables weight decay applies to: the matrix kernels the model declares
    (`model.kernels()`: the convolutions of a hybrid's trunk, every projection, the
    MLPs, `pre_logits`, the heads); not biases, norm scales and offsets, position
    tables, the class token or the [mask] embedding. Only trainable ones, in the
    order of `model.trainable_variables`.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=10)
    >>> len(decayed_variables(model))  # projection, qkv, attention_output, fc1, fc2, head
    6
    """
    if not callable(getattr(model, "kernels", None)):
        raise ValueError(
            f"Weight decay needs a keras-vit model (ViT, TrainingModel, "
            f"MaskedPatchPrediction), which declares its kernels; {model.name!r} is a "
            f"{type(model).__name__}: pass weight_decay=0 or wrap a keras_vit.ViT."
        )
    kernels = {id(v) for v in model.kernels()}
    return [v for v in model.trainable_variables if id(v) in kernels]


def make_optimizer(
    name,
    learning_rate,
    model,
    *,
    weight_decay=0.0,
    momentum=0.9,
    beta_2=0.999,
    clip_norm=1.0,
    accumulation_steps=1,
):
    """Builds a Keras optimizer for `model` as the paper trains.

    Args:
        name: `"adam"` / `"adamw"` (same thing in Keras 3: weight decay is decoupled,
            `w -= learning_rate * weight_decay * w`) or `"sgd"` (with momentum).
        learning_rate: a float or a `keras.optimizers.schedules.LearningRateSchedule`.
        model: the model to train; its `decayed_variables` get weight decay, nothing else.
        weight_decay: decoupled weight decay (0: none).
        momentum: SGD momentum, or Adam's beta_1.
        beta_2: Adam's beta_2.
        clip_norm: global-norm gradient clipping (None: no clipping).
        accumulation_steps: average the gradients of this many batches per update.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                       num_heads=4, mlp_dim=64, num_classes=10)
    >>> optimizer = make_optimizer("adamw", 1e-3, model, weight_decay=0.1)
    >>> type(optimizer).__name__, optimizer.global_clipnorm
    ('Adam', 1.0)
    """
    check_choice("optimizer", name, OPTIMIZERS)
    check_positive_int("accumulation_steps", accumulation_steps)
    common = dict(
        learning_rate=learning_rate,
        weight_decay=weight_decay or None,
        global_clipnorm=clip_norm,
        # Keras counts accumulation as "steps >= 2"; one step means none.
        gradient_accumulation_steps=int(accumulation_steps) if accumulation_steps > 1 else None,
    )
    if name == "sgd":
        optimizer = keras.optimizers.SGD(momentum=momentum, **common)
    else:
        # Every Keras 3 optimizer decays decoupled; Adam(weight_decay) is AdamW.
        optimizer = Adam(beta_1=momentum, beta_2=beta_2, **common)
    if weight_decay:
        decayed = {id(v) for v in decayed_variables(model)}
        optimizer.exclude_from_weight_decay(
            var_list=[v for v in model.trainable_variables if id(v) not in decayed]
        )
    return optimizer
