"""The training engine: one `TrainConfig`, one `train(config)`, a normal `model.fit` inside.

`train` builds the strategy, the input pipelines, the model and its optimizer (in the
strategy's scope), compiles, and calls `fit` with the engine's callbacks; it writes the
run's output folder (see `keras_vit.training.runs`). TensorFlow backend only (tf.data and
tf.distribute).
"""

import dataclasses
import json
import logging
import math
import os
import time
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from keras_vit.data import pipelines as vit_data
from keras_vit.training import distribute
from keras_vit.training import multiworker
from keras_vit.training import runs
from keras_vit.models import mpp as vit_mpp
from keras_vit.training.callbacks import EpochCheckpoints, TrainingBackup
from keras_vit.training.losses import SigmoidCrossEntropy
from keras_vit.models.vit import ViT
from keras_vit.training.optimizers import OPTIMIZERS, make_optimizer
from keras_vit.training.schedules import DECAYS, WarmupDecay

logger = logging.getLogger("keras_vit")

LOSSES = ("softmax", "sigmoid")
OBJECTIVES = ("supervised", "mpp")


@dataclasses.dataclass
class TrainConfig:
    """Everything a training run needs; recipes are instances of it.

    Model: `model` is a paper variant (`"B/16"`) or `"custom"`; `model_kwargs` are more
    `keras_vit.ViT` arguments (`patch_size`, `hidden_dim`, ..., `representation_size`,
    `dropout_rate`, `classifier`); `image_size`, `channels` (1 or 3; sources are
    converted); `head_bias_init` (None: -10 with the sigmoid loss, else 0); `init_from`:
    weights to start from (a run folder, a `.keras` file or any checkpoint
    `keras_vit.load_pretrained` reads; resampled to the new resolution, head reset on
    a class mismatch), `interpolation` for that resampling; `lora_rank`: fine-tune
    LoRA factors of that rank on the attention and MLP kernels, and the head, the rest
    frozen (`keras_vit.training.lora`; saved models hold the merged kernels).

    Data: `data` and `eval_data` (`"digits"`, `"tfds:NAME[:SPLIT]"`, a folder; eval
    defaults to the source's test split; `evaluate=False` skips evaluation); `classes`
    selects some of the source's classes, relabelled in order (e.g. `"0-4"`, see
    `keras_vit.data.pipelines.select_classes`); `batch_size` is global, per optimizer update,
    and `accumulation_steps` splits it into that many batches whose gradients are
    averaged; `epochs` passes over the data, or `steps` optimizer updates (rounded up
    to whole epochs); `steps_per_epoch` overrides the epoch length (in batches);
    `inception_crop`, `crop_area`, `random_flip`, `augment` (AugReg level),
    `randaugment` (num_ops, magnitude), `mixup`, `cutmix`, `augmentations` (more Keras
    layers), `eval_crop_fraction`, `shuffle_buffer`, `cache`, `strict_data`.

    Optimization: `optimizer` (`adam`, `adamw`, `sgd`), `learning_rate` (peak),
    `weight_decay` (decoupled, kernels only), `momentum` (SGD momentum / Adam beta_1),
    `beta_2`, `schedule` (`linear` to `end_learning_rate`, `cosine`, `constant`),
    `warmup_steps` (optimizer updates), `clip_norm` (global norm), `loss` (`softmax`,
    `sigmoid`), `label_smoothing`.

    Objective: `objective` is `supervised` (classify the source's labels) or `mpp`:
    self-supervised masked patch prediction (`keras_vit.MaskedPatchPrediction`; the
    source's labels are ignored, the model is built without a head, and the encoder is
    what the run saves), with `mpp_bits` (bits per colour channel of the targets),
    `mpp_corrupt_rate`, `mpp_mask_rate` and `mpp_random_rate` (the paper's 3, 0.5, 0.8,
    0.1).

    Engine: `strategy` (`auto`, `tpu`, `mirrored`, `multiworker`, `cpu`), `precision`
    (`auto`, `float32`, `mixed_float16`, `mixed_bfloat16`), `jit_compile` (`auto`: XLA
    where the strategy allows it, `on`, `off`), `steps_per_execution`, `seed`,
    `deterministic` (TensorFlow op determinism), `backup_every` (steps between
    mid-epoch backups), `keep_checkpoints`, `tensorboard`, `eval_every` (epochs),
    `out` (the output folder).

    Example:

    >>> config = TrainConfig(model="custom", model_kwargs=dict(patch_size=4,
    ...     hidden_dim=32, num_layers=1, num_heads=2, mlp_dim=64), image_size=8,
    ...     channels=1, batch_size=128, epochs=1, learning_rate=1e-3)
    >>> config.micro_batch_size
    128
    """

    model: str = "B/16"
    image_size: int = 224
    batch_size: int = 512
    epochs: int = 1
    learning_rate: float = 1e-3
    model_kwargs: dict = dataclasses.field(default_factory=dict)
    channels: int = 3
    head_bias_init: Optional[float] = None
    init_from: Optional[str] = None
    interpolation: Optional[str] = None
    lora_rank: Optional[int] = None
    data: str = "digits"
    eval_data: Optional[str] = None
    classes: Optional[str] = None
    evaluate: bool = True
    accumulation_steps: int = 1
    steps: Optional[int] = None
    steps_per_epoch: Optional[int] = None
    inception_crop: bool = True
    crop_area: tuple = (0.05, 1.0)
    random_flip: bool = True
    augment: str = "none"
    randaugment: Optional[tuple] = None
    mixup: Optional[float] = None
    cutmix: Optional[float] = None
    augmentations: list = dataclasses.field(default_factory=list)
    eval_crop_fraction: float = 0.875
    shuffle_buffer: Optional[int] = None
    cache: bool = False
    strict_data: bool = False
    optimizer: str = "adam"
    weight_decay: float = 0.0
    momentum: float = 0.9
    beta_2: float = 0.999
    schedule: str = "linear"
    warmup_steps: int = 0
    end_learning_rate: float = 1e-5
    clip_norm: Optional[float] = 1.0
    loss: str = "softmax"
    label_smoothing: float = 0.0
    objective: str = "supervised"
    mpp_bits: int = 3
    mpp_corrupt_rate: float = 0.5
    mpp_mask_rate: float = 0.8
    mpp_random_rate: float = 0.1
    strategy: str = "auto"
    precision: str = "auto"
    jit_compile: str = "auto"
    steps_per_execution: int = 1
    seed: int = 0
    deterministic: bool = False
    backup_every: Optional[int] = None
    keep_checkpoints: int = 3
    tensorboard: bool = True
    eval_every: int = 1
    out: str = "runs/train"

    def __post_init__(self):
        self.crop_area = tuple(self.crop_area)
        if self.randaugment is not None:
            self.randaugment = tuple(self.randaugment)
        self.augmentations = list(self.augmentations)
        self.model_kwargs = dict(self.model_kwargs)

    @property
    def micro_batch_size(self):
        """The batch of one forward/backward pass: `batch_size / accumulation_steps`."""
        return self.batch_size // self.accumulation_steps

    def validate(self):
        """Raises `ValueError` naming the first field with a bad value."""
        choices = dict(
            optimizer=OPTIMIZERS,
            schedule=DECAYS,
            loss=LOSSES,
            objective=OBJECTIVES,
            augment=tuple(vit_data.AUGREG_LEVELS),
            strategy=distribute.STRATEGIES,
            precision=distribute.PRECISIONS,
            jit_compile=("auto", "on", "off"),
        )
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is not one of {', '.join(map(repr, allowed))}."
                )
        positive = (
            "image_size", "batch_size", "epochs", "accumulation_steps", "steps_per_execution",
            "keep_checkpoints", "eval_every",
        )
        for name in positive:
            if int(getattr(self, name)) != getattr(self, name) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}.")
        for name in ("steps", "steps_per_epoch", "backup_every", "shuffle_buffer"):
            value = getattr(self, name)
            if value is not None and (int(value) != value or value < 1):
                raise ValueError(f"{name} must be None or a positive integer, got {value!r}.")
        if self.batch_size % self.accumulation_steps:
            raise ValueError(
                f"batch_size {self.batch_size} is not divisible by accumulation_steps "
                f"{self.accumulation_steps}."
            )
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}.")
        if self.classes is not None:
            vit_data.parse_classes(self.classes)
        if self.model != "custom":
            from keras_vit.models.vit import parse_variant

            parse_variant(self.model)
        low, high = self.crop_area
        if not 0 < low <= high <= 1:
            raise ValueError(f"crop_area must be (low, high) with 0 < low <= high <= 1, got {self.crop_area!r}.")
        if self.objective == "mpp":
            self._validate_mpp()
        if self.backup_every and self.backup_every % self.steps_per_execution:
            raise ValueError(
                f"backup_every {self.backup_every} must be a multiple of steps_per_execution "
                f"{self.steps_per_execution}."
            )
        return self

    def _validate_mpp(self):
        vit_mpp._check_bits(self.mpp_bits, prefix="mpp_")
        vit_mpp._check_rates(
            self.mpp_corrupt_rate, self.mpp_mask_rate, self.mpp_random_rate, prefix="mpp_"
        )
        # Settings of the supervised loss mean nothing here: a recipe that sets them
        # was written for the other objective.
        supervised = dict(loss="softmax", label_smoothing=0.0)
        for name, default in supervised.items():
            if getattr(self, name) != default:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} does not apply to objective='mpp' "
                    f"(its loss is softmax cross-entropy on colour codes, without labels); "
                    f"set {name}={default!r}."
                )

    def to_dict(self):
        """A JSON-ready dict (augmentation layers serialized).

        Example:

        >>> TrainConfig(epochs=3).to_dict()["epochs"]
        3
        """
        config = dataclasses.asdict(self)
        config["augmentations"] = [
            keras.layers.serialize(layer) if isinstance(layer, keras.layers.Layer) else layer
            for layer in self.augmentations
        ]
        return config

    @classmethod
    def from_dict(cls, config):
        """The inverse of `to_dict`; unknown keys are an error naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(
                f"Unknown config keys {unknown}; valid keys: {', '.join(sorted(known))}."
            )
        return cls(**config)


class ResumableFit:
    """What `train` adds to the `fit` of the models it trains (a `keras.Model` mixin).

    `pass_steps`: after a restart from a mid-epoch backup, the next `n` steps of `fit`
    are passed over without reading data or changing any state, so the epoch continues
    where it was. Engine-level fixes to `fit` belong here, so that every objective's
    model (`TrainingModel`, `MaskedPatchTraining`) gets them; those that make `fit`
    work under `MultiWorkerMirroredStrategy` come from the
    `keras_vit.training.multiworker.MultiWorkerFit` mixin, which both models also derive from.

    Example:

    >>> issubclass(TrainingModel, ResumableFit)
    True
    """

    def pass_steps(self, steps):
        """Makes the next `steps` training steps no-ops (they must be whole executions)."""
        if steps % self.steps_per_execution:
            raise ValueError(
                f"Cannot pass over {steps} steps in executions of {self.steps_per_execution}."
            )
        self._calls_to_pass = steps // self.steps_per_execution

    def make_train_function(self, force=False):
        super().make_train_function(force)
        step_function = self.train_function
        if getattr(step_function, "passes_steps", False):
            return step_function

        def train_function(iterator):
            if getattr(self, "_calls_to_pass", 0):
                self._calls_to_pass -= 1
                return self.get_metrics_result()
            return step_function(iterator)

        train_function.passes_steps = True
        self.train_function = train_function
        return train_function


@keras.saving.register_keras_serializable(package="keras_vit")
class TrainingModel(ResumableFit, multiworker.MultiWorkerFit, keras.Model):
    """The functional model `train` fits: a `keras_vit.ViT`'s graph, plus resume support.

    Built from any functional model (`TrainingModel.wrap(vit)`), it shares that model's
    layers and weights, so the plain model is what gets saved. `fit` resumes mid-epoch
    (`ResumableFit`).

    Example:

    >>> import keras_vit
    >>> vit = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...                     num_heads=4, mlp_dim=64, num_classes=10)
    >>> trainer = TrainingModel.wrap(vit)
    >>> trainer.weights[0] is vit.weights[0]
    True
    """

    @classmethod
    def wrap(cls, model):
        return cls(inputs=model.inputs, outputs=model.outputs, name=model.name)


class MaskedPatchTraining(
    ResumableFit, multiworker.MultiWorkerFit, vit_mpp.MaskedPatchPrediction
):
    """`keras_vit.MaskedPatchPrediction` as `train` fits it (`objective="mpp"`).

    Example:

    >>> import keras_vit
    >>> encoder = keras_vit.ViT(image_size=16, patch_size=4, hidden_dim=32, num_layers=1,
    ...                         num_heads=2, mlp_dim=64, include_top=False)
    >>> MaskedPatchTraining(encoder, seed=0).encoder is encoder
    True
    """


@dataclasses.dataclass
class TrainResult:
    """What `train` returns: the trained model, Keras' history and the final metrics."""

    model: keras.Model
    history: dict
    metrics: dict
    out: str


def _eval_source(config):
    if not config.evaluate:
        return None
    if config.eval_data:
        return vit_data.load_source(config.eval_data, "test", strict=config.strict_data)
    if vit_data.spec_split(config.data):
        logger.warning("No evaluation data: data names its split; set eval_data to evaluate.")
        return None
    try:
        return vit_data.load_source(config.data, "test", strict=config.strict_data)
    except vit_data.NoSplitError as error:
        logger.warning("No evaluation data: %s Set eval_data to evaluate.", error)
        return None


def _build_model(config, num_classes):
    head_bias = config.head_bias_init
    if head_bias is None:
        head_bias = -10.0 if config.loss == "sigmoid" else 0.0
    variant = None if config.model == "custom" else config.model
    return ViT(
        variant,
        image_size=config.image_size,
        num_classes=num_classes,
        channels=config.channels,
        head_bias_init=head_bias,
        include_top=config.objective == "supervised",
        **config.model_kwargs,
    )


def _objective(config, network, num_classes):
    """The model `fit` trains around `network`, and its `compile` arguments."""
    if config.objective == "mpp":
        model = MaskedPatchTraining(
            network,
            bits=config.mpp_bits,
            corrupt_rate=config.mpp_corrupt_rate,
            mask_rate=config.mpp_mask_rate,
            random_rate=config.mpp_random_rate,
            seed=config.seed,
        )
        return model, {}  # It computes its loss and masked-patch accuracy itself.
    if config.loss == "sigmoid":
        loss = SigmoidCrossEntropy()
    else:
        loss = keras.losses.CategoricalCrossentropy(
            from_logits=True, label_smoothing=config.label_smoothing
        )
    metrics = [keras.metrics.CategoricalAccuracy(name="top1")]
    if num_classes > 5:
        metrics.append(keras.metrics.TopKCategoricalAccuracy(k=5, name="top5"))
    return TrainingModel.wrap(network), dict(loss=loss, metrics=metrics)


def _check_resumable(config, out):
    """A backup may only be resumed by the configuration that wrote it."""
    path = os.path.join(out, runs.CONFIG)
    if not tf.io.gfile.exists(path):
        return
    with tf.io.gfile.GFile(path) as f:
        saved = json.load(f)
    current = json.loads(json.dumps(config.to_dict()))
    ignore = {"out", "strategy", "tensorboard", "keep_checkpoints"}
    changed = sorted(k for k in current if k not in ignore and saved.get(k) != current[k])
    if changed:
        raise ValueError(
            f"{out} holds an unfinished run whose config differs in {changed}; resume it with "
            f"the same settings, or pick another output folder (or delete {out}/{runs.BACKUP})."
        )


def _write_json(path, value):
    with tf.io.gfile.GFile(path, "w") as f:
        json.dump(value, f, indent=2, default=float)


def train(config, *, callbacks=(), verbose="auto"):
    """Trains a ViT as `config` says, writing the run under `config.out`.

    With `objective="mpp"` the model trained is `MaskedPatchTraining` around a headless
    ViT, and that encoder is what the run saves (`model.keras`, checkpoints), ready for
    fine-tuning or few-shot evaluation with `--from`.

    A run whose output folder holds an unfinished backup resumes from it (same config
    required). Returns a `TrainResult`; raises `FloatingPointError` (naming the last good
    checkpoint) when the loss becomes NaN or infinite.

    Args:
        config: a `TrainConfig`.
        callbacks: more Keras callbacks for `fit`.
        verbose: `fit`'s verbosity (progress bar: 1).

    Example:

    >>> import tempfile
    >>> config = TrainConfig(model="custom", model_kwargs=dict(patch_size=4,
    ...     hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32), image_size=8,
    ...     channels=1, batch_size=256, epochs=1, learning_rate=1e-3, tensorboard=False,
    ...     out=tempfile.mkdtemp())
    >>> result = train(config, verbose=0)
    >>> sorted(result.metrics)
    ['loss', 'top1', 'top5']
    """
    config.validate()
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            "keras_vit.train runs on the TensorFlow backend (tf.data, tf.distribute); "
            f"set KERAS_BACKEND=tensorflow (now {keras.backend.backend()!r})."
        )
    out = config.out
    if config.init_from:
        weights = os.path.abspath(runs.resolve_from(config.init_from))
        if weights.startswith(os.path.abspath(out) + os.sep):
            raise ValueError(
                f"out={out!r} holds the init_from weights {weights!r}: the run would "
                "overwrite them; pick another output folder."
            )
    backup_dir = os.path.join(out, runs.BACKUP)
    epoch0, step0 = TrainingBackup.saved_position(backup_dir)
    resuming = (epoch0, step0) != (0, 0)
    if resuming:
        _check_resumable(config, out)
    keras.utils.set_random_seed(config.seed)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    strategy = distribute.make_strategy(config.strategy)

    def written(name):  # Only the chief writes the run folder (see keras_vit.multiworker).
        return multiworker.write_path(os.path.join(out, name), strategy)

    tf.io.gfile.makedirs(out)
    _write_json(written(runs.CONFIG), config.to_dict())
    policy = distribute.precision_policy(config.precision, strategy)
    jit = {"on": True, "off": False}.get(config.jit_compile, distribute.jit_allowed(strategy))
    logger.info("Strategy %s; precision %s; XLA %s.", distribute.describe(strategy), policy, jit)

    train_source = vit_data.load_source(config.data, "train", strict=config.strict_data)
    eval_source = _eval_source(config)
    if config.classes is not None:
        train_source = vit_data.select_classes(train_source, config.classes)
        eval_source = eval_source and vit_data.select_classes(eval_source, config.classes)
    skipped = train_source.skipped + (eval_source.skipped if eval_source else [])
    if skipped:
        with tf.io.gfile.GFile(written("skipped_files.txt"), "w") as f:
            f.write("\n".join(skipped) + "\n")
    micro_batch = config.micro_batch_size
    steps_per_epoch = config.steps_per_epoch or train_source.size // micro_batch
    if steps_per_epoch < 1:
        raise ValueError(
            f"batch_size {micro_batch} per step is larger than the {train_source.size} "
            f"training examples of {train_source.name}."
        )
    steps_per_epoch -= steps_per_epoch % config.steps_per_execution
    if config.steps:
        epochs = math.ceil(config.steps * config.accumulation_steps / steps_per_epoch)
    else:
        epochs = config.epochs
    total_updates = epochs * steps_per_epoch // config.accumulation_steps
    if config.warmup_steps >= total_updates:
        raise ValueError(
            f"warmup_steps {config.warmup_steps} must be fewer than the run's "
            f"{total_updates} optimizer updates."
        )

    def make_train(input_context=None):
        return vit_data.train_dataset(
            train_source,
            config.image_size,
            micro_batch,
            channels=config.channels,
            seed=config.seed,
            inception_crop=config.inception_crop,
            crop_area=config.crop_area,
            random_flip=config.random_flip,
            augment=config.augment,
            randaugment=config.randaugment,
            mixup=config.mixup,
            cutmix=config.cutmix,
            layers=config.augmentations,
            shuffle_buffer=config.shuffle_buffer,
            cache=config.cache,
            start_batch=epoch0 * steps_per_epoch + step0,
            input_context=input_context,
        )

    def make_eval(input_context=None):
        return vit_data.eval_dataset(
            eval_source,
            config.image_size,
            micro_batch,
            channels=config.channels,
            crop_fraction=config.eval_crop_fraction,
            cache=config.cache,
            input_context=input_context,
        )

    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    if multi_worker:
        train_data = strategy.distribute_datasets_from_function(make_train)
        eval_data = eval_source and strategy.distribute_datasets_from_function(make_eval)
    else:
        train_data = make_train()
        eval_data = eval_source and make_eval()

    previous_policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        with strategy.scope():
            vit = _build_model(config, train_source.num_classes)
            if config.init_from:
                logger.info(runs.load_weights(vit, config.init_from, interpolation=config.interpolation))
            if config.lora_rank:
                from keras_vit.training.lora import enable_lora

                counts = enable_lora(vit, config.lora_rank)
                logger.info(
                    "LoRA rank %d on %d Dense layers: %d of %d parameters trainable (%.1f%%).",
                    config.lora_rank, counts["layers"], counts["trainable"], counts["total"],
                    100 * counts["trainable"] / counts["total"],
                )
            model, objective = _objective(config, vit, train_source.num_classes)
            schedule = WarmupDecay(
                config.learning_rate,
                total_steps=total_updates,
                warmup_steps=config.warmup_steps,
                decay=config.schedule,
                end_learning_rate=config.end_learning_rate,
                accumulation_steps=config.accumulation_steps,
            )
            optimizer = make_optimizer(
                config.optimizer,
                schedule,
                model,
                weight_decay=config.weight_decay,
                momentum=config.momentum,
                beta_2=config.beta_2,
                clip_norm=config.clip_norm,
                accumulation_steps=config.accumulation_steps,
            )
            model.compile(
                optimizer=optimizer,
                jit_compile=jit,
                steps_per_execution=config.steps_per_execution,
                **objective,
            )
    finally:
        keras.config.set_dtype_policy(previous_policy)

    engine_callbacks = [
        TrainingBackup(backup_dir, every=config.backup_every),
        EpochCheckpoints(vit, os.path.join(out, runs.CHECKPOINTS), keep=config.keep_checkpoints),
        keras.callbacks.TerminateOnNaN(),
        keras.callbacks.CSVLogger(written(runs.METRICS_CSV), append=resuming),
    ]
    if config.tensorboard:
        try:
            import tensorboard  # noqa: F401  (tf.summary writes nothing without it)

            engine_callbacks.append(
                keras.callbacks.TensorBoard(written(runs.LOGS), write_graph=False)
            )
        except ImportError:
            logger.warning("TensorBoard is not installed (pip install tensorboard): no logs/.")
    start = time.time()
    history = model.fit(
        train_data,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        initial_epoch=epoch0,
        validation_data=eval_data or None,
        validation_freq=config.eval_every,
        callbacks=engine_callbacks + list(callbacks),
        shuffle=False,  # The stream is shuffled (and seeded) by the pipeline.
        verbose=verbose,
    )
    seconds = time.time() - start
    losses = history.history.get("loss", [])
    if losses and not np.isfinite(losses[-1]):
        last_good = runs.latest_checkpoint(out)
        raise FloatingPointError(
            f"Training stopped: the loss became {losses[-1]} in epoch {len(losses) + epoch0}. "
            f"Last good checkpoint: {last_good or 'none'}; the backup in {backup_dir} holds "
            "the last good training state."
        )
    vit.save(written(runs.MODEL))
    final = {}
    if eval_data:
        final = model.evaluate(eval_data, verbose=0, return_dict=True)
    _write_json(
        written(runs.METRICS_JSON),
        dict(
            final=final,
            history=history.history,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            optimizer_updates=total_updates,
            train_examples=train_source.size,
            eval_examples=eval_source.size if eval_source else 0,
            skipped_files=skipped,
            seconds=seconds,
            strategy=distribute.describe(strategy),
            precision=policy,
            jit_compile=jit,
        ),
    )
    if not multiworker.is_chief(strategy):  # Its copies of the run's files were temporary.
        tf.io.gfile.rmtree(os.path.dirname(written(runs.MODEL)))
    return TrainResult(model=vit, history=history.history, metrics=final, out=out)
