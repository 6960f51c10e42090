"""The run config: `TrainConfig`, its sections, and the `key=value` override language.

A `TrainConfig` has one section per concern, as big_vision's configs do: `model`,
`data`, `optimization`, `schedule`, `checkpointing`, `distribution`, `evaluation`, plus
the run's `seed` and output folder `out`. It is what recipes are and what a run writes
to its `config.json` (`to_dict` / `from_dict`).

Counts have one meaning each: an *update* is one optimizer update (`schedule.updates`,
`schedule.warmup_updates`); a *micro-batch* is one forward/backward pass of
`batch_size / optimization.micro_batches_per_update` examples, which is what Keras calls
a step (`schedule.micro_batches_per_epoch`, `checkpointing.backup_every_micro_batches`,
`distribution.micro_batches_per_execution`).

The flat keys of keras-vit 0.1 (`learning_rate`, `model_kwargs`, `steps`, ...; see
`FLAT_KEYS`) are still accepted by `TrainConfig(...)`, `from_dict` (the `config.json` of
older runs) and `apply_overrides` (`--set`): each is mapped to its section with a
one-line deprecation note.

Importing this module does not import Keras or TensorFlow (the command line parses
and checks configs before starting them); `validate` imports what it checks against.
"""

import ast
import dataclasses
import logging
import typing
from typing import Optional

from keras_vit.utils.checks import (
    check_choice,
    check_in_range,
    check_non_negative_int,
    check_positive_int,
)

logger = logging.getLogger("keras_vit")

LOSSES = ("softmax", "sigmoid")
OBJECTIVES = ("supervised", "mpp")
JIT_COMPILE = ("auto", "on", "off")
# distribution.strategy on the JAX backend: data parallel over every device, or FSDP.
JAX_STRATEGIES = ("auto", "fsdp")
MAX_LEARNING_RATE = 10

# The backends `keras_vit.train` runs on: its input pipelines and strategies are
# tf.data and tf.distribute, or keras.distribution on JAX.
TRAINING_BACKENDS = ("tensorflow", "jax")


def check_training_backend(backend, what="keras_vit.train"):
    """Raises `ValueError` saying what to set when `backend` cannot run a training run.

    Example:

    >>> check_training_backend("torch", "keras-vit demo")
    Traceback (most recent call last):
    ...
    ValueError: keras-vit demo trains on the TensorFlow or the JAX backend, not 'torch': set KERAS_BACKEND=tensorflow or jax (the models it writes load on PyTorch too).
    """
    if backend not in TRAINING_BACKENDS:
        raise ValueError(
            f"{what} trains on the TensorFlow or the JAX backend, not {backend!r}: set "
            "KERAS_BACKEND=tensorflow or jax (the models it writes load on PyTorch too)."
        )


@dataclasses.dataclass
class ModelConfig:
    """`model`: the network and the weights it starts from.

    `variant` is a paper variant (`"B/16"`) or `"custom"`; `kwargs` are more
    `keras_vit.ViT` arguments (`patch_size`, `hidden_dim`, ..., `representation_size`,
    `dropout_rate`, `classifier`); `image_size`, `channels` (1 or 3; sources are
    converted); `head_bias_init` (None: -10 with the sigmoid loss, else 0); `init_from`:
    weights to start from (a run folder, a `.keras` file or any checkpoint
    `keras_vit.load_pretrained` reads; resampled to the new resolution, head reset on a
    class mismatch), `interpolation` for that resampling; `lora_rank`: fine-tune LoRA
    factors of that rank on the attention and MLP kernels, and the head, the rest frozen
    (`keras_vit.training.lora`; saved models hold the merged kernels).
    """

    variant: str = "B/16"
    kwargs: dict = dataclasses.field(default_factory=dict)
    image_size: int = 224
    channels: int = 3
    head_bias_init: Optional[float] = None
    init_from: Optional[str] = None
    interpolation: Optional[str] = None
    lora_rank: Optional[int] = None

    def __post_init__(self):
        self.kwargs = dict(self.kwargs)

    def validate(self):
        from keras_vit.models.architecture import check_arguments
        from keras_vit.models.variants import parse_variant

        check_positive_int("model.image_size", self.image_size)
        check_choice("model.channels", self.channels, (1, 3))
        check_in_range("model.head_bias_init", self.head_bias_init, "(-inf, inf)", optional=True)
        check_positive_int("model.lora_rank", self.lora_rank, optional=True)
        if self.variant != "custom":
            parse_variant(self.variant)
        for name in ("image_size", "channels", "head_bias_init", "num_classes", "include_top"):
            if name in self.kwargs:
                raise ValueError(
                    f"model.kwargs.{name} is set by the run: "
                    + (f"set model.{name} instead." if hasattr(self, name)
                       else "from the data and the objective.")
                )
        check_arguments(self.kwargs)


@dataclasses.dataclass
class DataConfig:
    """`data`: the training source and its input pipeline.

    `source` (`"digits"`, `"tfds:NAME[:SPLIT]"`, a folder); `data_dir`: where TFDS
    datasets are prepared (default `TFDS_DATA_DIR`, then TFDS's own); `classes` selects some of
    the source's classes (for training and evaluation), relabelled in order (e.g.
    `"0-4"`, see `keras_vit.data.select_classes`); `batch_size` is global, per optimizer
    update; `inception_crop`, `crop_area`, `random_flip`, `augment` (AugReg level),
    `randaugment` (num_ops, magnitude), `mixup`, `cutmix`, `augmentations` (more Keras
    layers, or their serialized dicts), `shuffle_buffer`, `cache`, `strict`
    (undecodable files are an error, not skipped).

    `naflex`: train a NaFlex model (`keras_vit.ViT(naflex=True)`) on each image at its
    own aspect ratio (`keras_vit.data.naflex_pipelines`), resized to the largest patch
    grid within `naflex_max_patches` tokens; batches padded to the smallest of
    `naflex_buckets` (token counts; the budget is always one) that holds their longest
    image, or with `images_per_row` K packed into rows of `row_tokens` tokens (default
    K budgets) of up to K images each (`ViT(naflex=True, images_per_row=K)`).
    """

    source: str = "digits"
    data_dir: Optional[str] = None
    classes: Optional[str] = None
    batch_size: int = 512
    inception_crop: bool = True
    crop_area: tuple = (0.05, 1.0)
    random_flip: bool = True
    augment: str = "none"
    randaugment: Optional[tuple] = None
    mixup: Optional[float] = None
    cutmix: Optional[float] = None
    augmentations: list = dataclasses.field(default_factory=list)
    shuffle_buffer: Optional[int] = None
    cache: bool = False
    strict: bool = False
    naflex: bool = False
    naflex_max_patches: int = 256
    naflex_buckets: Optional[tuple] = None
    images_per_row: Optional[int] = None
    row_tokens: Optional[int] = None

    def __post_init__(self):
        self.crop_area = tuple(self.crop_area)
        if self.naflex_buckets is not None:
            self.naflex_buckets = tuple(self.naflex_buckets)
        if self.randaugment is not None:
            self.randaugment = tuple(self.randaugment)
        self.augmentations = list(self.augmentations)

    def validate(self):
        from keras_vit import data as vit_data

        check_choice("data.augment", self.augment, tuple(vit_data.AUGREG_LEVELS))
        check_positive_int("data.batch_size", self.batch_size)
        check_positive_int("data.shuffle_buffer", self.shuffle_buffer, optional=True)
        if self.classes is not None:
            vit_data.parse_classes(self.classes)
        # MixUp's and CutMix's Beta alpha; 0 turns them off.
        check_in_range("data.mixup", self.mixup, "[0, inf)", optional=True)
        check_in_range("data.cutmix", self.cutmix, "[0, inf)", optional=True)
        if self.randaugment is not None:
            if len(self.randaugment) != 2:
                raise ValueError(
                    f"data.randaugment must be (num_ops, magnitude), got {self.randaugment!r}."
                )
            check_positive_int("data.randaugment num_ops", self.randaugment[0])
            check_in_range("data.randaugment magnitude", self.randaugment[1], "[0, 30]")
        low, high = self.crop_area
        if not 0 < low <= high <= 1:
            raise ValueError(
                f"data.crop_area must be (low, high) with 0 < low <= high <= 1, got {self.crop_area!r}."
            )
        self.validate_naflex()

    def naflex_layout(self, patch_size):
        """The `keras_vit.data.naflex.NaFlexLayout` of a NaFlex run's batches."""
        from keras_vit.data.naflex import NaFlexLayout

        return NaFlexLayout(patch_size, self.naflex_max_patches, self.naflex_buckets,
                            self.images_per_row, self.row_tokens)

    def validate_naflex(self):
        """The NaFlex settings: only with `naflex`, a valid layout, no MixUp/CutMix."""
        from keras_vit import data as vit_data

        layout = dict(naflex_buckets=self.naflex_buckets, images_per_row=self.images_per_row,
                      row_tokens=self.row_tokens)
        if not self.naflex:
            for name, value in layout.items():
                if value is not None:
                    raise ValueError(f"data.{name}={value!r} needs data.naflex=true.")
            return
        check_positive_int("data.naflex_max_patches", self.naflex_max_patches)
        try:  # its token counts (the model gives the patch size)
            self.naflex_layout(patch_size=1)
        except ValueError as error:
            raise ValueError(f"data.naflex: {error}") from None
        mixing = dict(mixup=self.mixup, cutmix=self.cutmix)
        if self.mixup is None:
            mixing["augment"] = self.augment if vit_data.AUGREG_LEVELS[self.augment][1] else None
        for name, value in mixing.items():
            if value:
                raise ValueError(
                    f"data.{name}={value!r} mixes images of one size (MixUp/CutMix), which "
                    "NaFlex batches (data.naflex=true) do not hold: "
                    + ("set data.mixup=0." if name == "augment" else f"set data.{name}=none.")
                )


@dataclasses.dataclass
class OptimizationConfig:
    """`optimization`: the objective, its loss, the optimizer and its gradients.

    `objective` is `supervised` (classify the source's labels, with `loss` `softmax` or
    `sigmoid` and `label_smoothing`) or `mpp`: self-supervised masked patch prediction
    (`keras_vit.MaskedPatchPrediction`; the labels are ignored, the model is built
    without a head, and the encoder is what the run saves), with `mpp_bits` (bits per
    colour channel of the targets), `mpp_corrupt_rate`, `mpp_mask_rate` and
    `mpp_random_rate` (the paper's 3, 0.5, 0.8, 0.1).

    `optimizer` (`adam`, `adamw`, `sgd`), `weight_decay` (decoupled, kernels only),
    `momentum` (SGD momentum / Adam beta_1), `beta_2`, `clip_norm` (global norm);
    `micro_batches_per_update` splits each update's batch into that many micro-batches
    whose gradients are averaged.
    """

    objective: str = "supervised"
    loss: str = "softmax"
    label_smoothing: float = 0.0
    mpp_bits: int = 3
    mpp_corrupt_rate: float = 0.5
    mpp_mask_rate: float = 0.8
    mpp_random_rate: float = 0.1
    optimizer: str = "adam"
    weight_decay: float = 0.0
    momentum: float = 0.9
    beta_2: float = 0.999
    clip_norm: Optional[float] = 1.0
    micro_batches_per_update: int = 1

    def validate(self):
        from keras_vit.models import mpp as vit_mpp
        from keras_vit.training.optimizers import OPTIMIZERS

        check_choice("optimization.objective", self.objective, OBJECTIVES)
        check_choice("optimization.loss", self.loss, LOSSES)
        check_choice("optimization.optimizer", self.optimizer, OPTIMIZERS)
        check_positive_int("optimization.micro_batches_per_update", self.micro_batches_per_update)
        check_in_range("optimization.label_smoothing", self.label_smoothing, "[0, 1)")
        check_in_range("optimization.weight_decay", self.weight_decay, "[0, inf)")
        check_in_range("optimization.momentum", self.momentum, "[0, 1)")
        check_in_range("optimization.beta_2", self.beta_2, "[0, 1)")
        check_in_range("optimization.clip_norm", self.clip_norm, "(0, inf)", optional=True)
        if self.objective != "mpp":
            return
        check_positive_int("optimization.mpp_bits", self.mpp_bits)
        vit_mpp.check_corruption_rates(
            self.mpp_corrupt_rate, self.mpp_mask_rate, self.mpp_random_rate,
            prefix="optimization.mpp_",
        )
        # Settings of the supervised loss mean nothing here: a recipe that sets them
        # was written for the other objective.
        for name, default in dict(loss="softmax", label_smoothing=0.0).items():
            if getattr(self, name) != default:
                raise ValueError(
                    f"optimization.{name}={getattr(self, name)!r} does not apply to "
                    f"objective='mpp' (its loss is softmax cross-entropy on colour codes, "
                    f"without labels); set optimization.{name}={default!r}."
                )


@dataclasses.dataclass
class ScheduleConfig:
    """`schedule`: how long the run is, and its learning rate over time.

    `learning_rate` (peak), `decay` (`linear` to `end_learning_rate`, `cosine`,
    `constant`) after `warmup_updates` optimizer updates of linear warmup; the run lasts
    `epochs` passes over the data, or `updates` optimizer updates (rounded up to whole
    epochs); `micro_batches_per_epoch` overrides the epoch length.
    """

    learning_rate: float = 1e-3
    decay: str = "linear"
    end_learning_rate: float = 1e-5
    warmup_updates: int = 0
    epochs: int = 1
    updates: Optional[int] = None
    micro_batches_per_epoch: Optional[int] = None

    def validate(self):
        from keras_vit.training.schedules import DECAYS

        check_choice("schedule.decay", self.decay, DECAYS)
        check_positive_int("schedule.epochs", self.epochs)
        check_positive_int("schedule.updates", self.updates, optional=True)
        check_positive_int("schedule.micro_batches_per_epoch", self.micro_batches_per_epoch, optional=True)
        # Past 10 every optimizer here diverges: such a value is a typo, not a setting.
        check_in_range("schedule.learning_rate", self.learning_rate, f"(0, {MAX_LEARNING_RATE}]")
        check_in_range(
            "schedule.end_learning_rate", self.end_learning_rate, f"[0, {MAX_LEARNING_RATE}]"
        )
        check_non_negative_int("schedule.warmup_updates", self.warmup_updates)


@dataclasses.dataclass
class CheckpointingConfig:
    """`checkpointing`: what the run keeps in its folder besides the final model.

    `backup_every_micro_batches` (None: a backup at the end of each epoch only; the run
    resumes from its newest backup), `keep_checkpoints` (the newest per-epoch `.keras`
    checkpoints kept), `tensorboard` (logs).
    """

    backup_every_micro_batches: Optional[int] = None
    keep_checkpoints: int = 3
    tensorboard: bool = True

    def validate(self):
        check_positive_int("checkpointing.keep_checkpoints", self.keep_checkpoints)
        check_positive_int(
            "checkpointing.backup_every_micro_batches", self.backup_every_micro_batches,
            optional=True,
        )


@dataclasses.dataclass
class DistributionConfig:
    """`distribution`: where and how the steps run.

    `strategy` (`auto`, `tpu`, `mirrored`, `multiworker`, `cpu`; on JAX `auto`, data
    parallel over every device, or `fsdp`, which also shards the weights), `precision` (`auto`,
    `float32`, `mixed_float16`, `mixed_bfloat16`), `jit_compile` (`auto`: XLA where the
    strategy allows it, `on`, `off`), `micro_batches_per_execution` (Keras'
    `steps_per_execution`), `deterministic` (TensorFlow op determinism). Several JAX
    processes (`keras_vit.training.jax_processes`): `coordinator` (process 0's
    `host:port`, or `"auto"`: found by `jax.distributed.initialize()` under Slurm or on a
    TPU pod; default `$JAX_COORDINATOR_ADDRESS`), `num_processes` and `process_id`
    (default `$JAX_NUM_PROCESSES`, `$JAX_PROCESS_ID`), `join_timeout` (seconds).
    """

    strategy: str = "auto"
    precision: str = "auto"
    jit_compile: str = "auto"
    micro_batches_per_execution: int = 1
    deterministic: bool = False
    coordinator: Optional[str] = None
    num_processes: Optional[int] = None
    process_id: Optional[int] = None
    join_timeout: int = 300

    def validate(self):
        from keras_vit.training import distribute

        check_choice("distribution.strategy", self.strategy, distribute.STRATEGIES + JAX_STRATEGIES[1:])
        check_choice("distribution.precision", self.precision, distribute.PRECISIONS)
        check_choice("distribution.jit_compile", self.jit_compile, JIT_COMPILE)
        check_positive_int("distribution.micro_batches_per_execution", self.micro_batches_per_execution)
        check_positive_int("distribution.num_processes", self.num_processes, optional=True)
        if self.process_id is not None:
            check_non_negative_int("distribution.process_id", self.process_id)
        check_positive_int("distribution.join_timeout", self.join_timeout)


@dataclasses.dataclass
class EvaluationConfig:
    """`evaluation`: the held-out data and how it is read.

    `enabled` (False skips evaluation), `source` (default: the training source's test
    split), `every_epochs`, `crop_fraction` (central crop of the eval preprocessing;
    served models and figures reuse it).
    """

    enabled: bool = True
    source: Optional[str] = None
    every_epochs: int = 1
    crop_fraction: float = 0.875

    def validate(self):
        check_positive_int("evaluation.every_epochs", self.every_epochs)
        check_in_range("evaluation.crop_fraction", self.crop_fraction, "(0, 1]", optional=True)


SECTIONS = dict(
    model=ModelConfig,
    data=DataConfig,
    optimization=OptimizationConfig,
    schedule=ScheduleConfig,
    checkpointing=CheckpointingConfig,
    distribution=DistributionConfig,
    evaluation=EvaluationConfig,
)

# keras-vit 0.1's flat keys, and where each lives now.
FLAT_KEYS = {
    "model": "model.variant",
    "model_kwargs": "model.kwargs",
    "image_size": "model.image_size",
    "channels": "model.channels",
    "head_bias_init": "model.head_bias_init",
    "init_from": "model.init_from",
    "interpolation": "model.interpolation",
    "data": "data.source",
    "classes": "data.classes",
    "batch_size": "data.batch_size",
    "inception_crop": "data.inception_crop",
    "crop_area": "data.crop_area",
    "random_flip": "data.random_flip",
    "augment": "data.augment",
    "randaugment": "data.randaugment",
    "mixup": "data.mixup",
    "cutmix": "data.cutmix",
    "augmentations": "data.augmentations",
    "shuffle_buffer": "data.shuffle_buffer",
    "cache": "data.cache",
    "strict_data": "data.strict",
    "objective": "optimization.objective",
    "loss": "optimization.loss",
    "label_smoothing": "optimization.label_smoothing",
    "mpp_bits": "optimization.mpp_bits",
    "mpp_corrupt_rate": "optimization.mpp_corrupt_rate",
    "mpp_mask_rate": "optimization.mpp_mask_rate",
    "mpp_random_rate": "optimization.mpp_random_rate",
    "optimizer": "optimization.optimizer",
    "weight_decay": "optimization.weight_decay",
    "momentum": "optimization.momentum",
    "beta_2": "optimization.beta_2",
    "clip_norm": "optimization.clip_norm",
    "accumulation_steps": "optimization.micro_batches_per_update",
    "learning_rate": "schedule.learning_rate",
    "schedule": "schedule.decay",
    "end_learning_rate": "schedule.end_learning_rate",
    "warmup_steps": "schedule.warmup_updates",
    "epochs": "schedule.epochs",
    "steps": "schedule.updates",
    "steps_per_epoch": "schedule.micro_batches_per_epoch",
    "backup_every": "checkpointing.backup_every_micro_batches",
    "keep_checkpoints": "checkpointing.keep_checkpoints",
    "tensorboard": "checkpointing.tensorboard",
    "strategy": "distribution.strategy",
    "precision": "distribution.precision",
    "jit_compile": "distribution.jit_compile",
    "steps_per_execution": "distribution.micro_batches_per_execution",
    "deterministic": "distribution.deterministic",
    "evaluate": "evaluation.enabled",
    "eval_data": "evaluation.source",
    "eval_every": "evaluation.every_epochs",
    "eval_crop_fraction": "evaluation.crop_fraction",
    "seed": "seed",
    "out": "out",
}


def is_flat_key(key, value=None):
    """Whether a top-level `key` (with `value`) is a keras-vit 0.1 flat key.

    `model`, `data` and `schedule` are both: a section given as a dict or section
    object, the 0.1 setting otherwise.

    Example:

    >>> is_flat_key("learning_rate"), is_flat_key("model", "B/16"), is_flat_key("model", {})
    (True, True, False)
    """
    if key in SECTIONS and isinstance(value, (dict, SECTIONS[key])):
        return False
    return key in FLAT_KEYS and FLAT_KEYS[key] != key


def sectioned(settings, where="TrainConfig"):
    """`settings` with every flat key moved into its section (a nested dict).

    Sections may be dicts or section objects; flat keys are applied after them (so
    `dataclasses.replace(config, epochs=3)` sets `schedule.epochs`). Logs one
    deprecation note naming the keys moved.

    Example:

    >>> sectioned({"learning_rate": 0.1, "schedule": {"epochs": 2}}, "example")
    {'schedule': {'epochs': 2, 'learning_rate': 0.1}}
    """
    result, moved = {}, []
    for key, value in settings.items():
        if not is_flat_key(key, value):
            if key in SECTIONS and isinstance(value, SECTIONS[key]):
                value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            elif key in SECTIONS and not isinstance(value, dict):
                raise ValueError(
                    f"{where}: {key} is a section: pass a {SECTIONS[key].__name__} or a dict "
                    f"of its keys, got {value!r}."
                )
            result[key] = dict(value) if key in SECTIONS else value
    for key, value in settings.items():
        if is_flat_key(key, value):
            section, _, name = FLAT_KEYS[key].partition(".")
            result.setdefault(section, {})[name] = value
            moved.append(f"{key} -> {FLAT_KEYS[key]}")
    if len(moved) > 4:  # a whole 0.1 config.json: one short line, not 55 names
        logger.warning(
            "%s: %d flat config keys of keras-vit 0.1 moved to their sections "
            "(keras_vit.training.config.FLAT_KEYS); flat keys are deprecated.",
            where, len(moved),
        )
    elif moved:
        logger.warning(
            "%s: flat config keys are deprecated, moved to their sections: %s.",
            where, ", ".join(moved),
        )
    return result


def _check_section_keys(name, values):
    fields = [f.name for f in dataclasses.fields(SECTIONS[name])]
    wrong = sorted(set(values) - set(fields))
    if wrong:
        raise ValueError(
            f"Unknown config keys {[f'{name}.{key}' for key in wrong]}; valid keys of "
            f"{name}: {', '.join(fields)}."
        )


@dataclasses.dataclass(init=False)
class TrainConfig:
    """Everything a training run needs, in sections; recipes are instances of it.

    Args:
        model: `ModelConfig` (or a dict of its fields): variant, sizes, initial weights.
        data: `DataConfig`: the training source, batch size, augmentation.
        optimization: `OptimizationConfig`: objective, loss, optimizer, accumulation.
        schedule: `ScheduleConfig`: run length and learning rate.
        checkpointing: `CheckpointingConfig`: backups, checkpoints kept, TensorBoard.
        distribution: `DistributionConfig`: strategy, precision, XLA.
        evaluation: `EvaluationConfig`: held-out data, frequency, eval crop.
        seed: seeds the weights, the data order and augmentation.
        out: the run's output folder.

    keras-vit 0.1's flat keywords (`TrainConfig(learning_rate=1e-3)`) are moved to their
    sections with a deprecation note (see `FLAT_KEYS`).

    Example:

    >>> config = TrainConfig(
    ...     model=ModelConfig(variant="custom", kwargs=dict(patch_size=4, hidden_dim=32,
    ...         num_layers=1, num_heads=2, mlp_dim=64), image_size=8, channels=1),
    ...     data=DataConfig(batch_size=128),
    ...     optimization=OptimizationConfig(micro_batches_per_update=2),
    ...     schedule=ScheduleConfig(epochs=1, learning_rate=1e-3))
    >>> config.micro_batch_size
    64
    >>> TrainConfig.from_dict(config.to_dict()) == config
    True
    """

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optimization: OptimizationConfig = dataclasses.field(default_factory=OptimizationConfig)
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    checkpointing: CheckpointingConfig = dataclasses.field(default_factory=CheckpointingConfig)
    distribution: DistributionConfig = dataclasses.field(default_factory=DistributionConfig)
    evaluation: EvaluationConfig = dataclasses.field(default_factory=EvaluationConfig)
    seed: int = 0
    out: str = "runs/train"

    def __init__(self, **settings):
        settings = sectioned(settings)
        known = [f.name for f in dataclasses.fields(TrainConfig)]
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise ValueError(
                f"Unknown config keys {unknown}; valid keys: {', '.join(known)} "
                f"(or a flat key of keras-vit 0.1: {', '.join(sorted(FLAT_KEYS))})."
            )
        for name, section in SECTIONS.items():
            values = settings.get(name, {})
            _check_section_keys(name, values)
            setattr(self, name, section(**values))
        self.seed = settings.get("seed", 0)
        self.out = settings.get("out", "runs/train")

    def replace(self, **changes):
        """A copy with some settings changed; the config itself is left as it was.

        `section=dict(key=value, ...)` changes those keys of a section and keeps the
        others; a section object replaces the section; `seed=` and `out=` are set.

        Example:

        >>> config = TrainConfig().replace(schedule=dict(epochs=3), out="runs/x")
        >>> config.schedule.epochs, config.schedule.learning_rate, config.out
        (3, 0.001, 'runs/x')
        """
        updated = {}
        for name, value in changes.items():
            if name in SECTIONS and isinstance(value, dict):
                _check_section_keys(name, value)
                value = dataclasses.replace(getattr(self, name), **value)
            updated[name] = value
        return dataclasses.replace(self, **updated)

    @property
    def micro_batch_size(self):
        """The batch of one forward/backward pass: `batch_size / micro_batches_per_update`."""
        return self.data.batch_size // self.optimization.micro_batches_per_update

    def validate(self):
        """Raises `ValueError` naming the first key with a bad value; returns self."""
        for name in SECTIONS:
            getattr(self, name).validate()
        check_non_negative_int("seed", self.seed)
        batches = self.optimization.micro_batches_per_update
        if self.data.batch_size % batches:
            raise ValueError(
                f"data.batch_size {self.data.batch_size} is not divisible by "
                f"optimization.micro_batches_per_update {batches}."
            )
        if self.data.naflex and self.optimization.objective != "supervised":
            raise ValueError(
                f"optimization.objective={self.optimization.objective!r} does not train on "
                "NaFlex batches: use objective='supervised' with data.naflex=true."
            )
        for name in ("naflex", "images_per_row"):
            if name in self.model.kwargs:
                raise ValueError(
                    f"model.kwargs.{name} is set by the run from its data: set data.{name} instead."
                )
        backup = self.checkpointing.backup_every_micro_batches
        execution = self.distribution.micro_batches_per_execution
        if backup and backup % execution:
            raise ValueError(
                f"checkpointing.backup_every_micro_batches {backup} must be a multiple of "
                f"distribution.micro_batches_per_execution {execution}."
            )
        return self

    def to_dict(self):
        """A JSON-ready nested dict, one dict per section (augmentation layers serialized).

        Example:

        >>> TrainConfig(schedule=ScheduleConfig(epochs=3)).to_dict()["schedule"]["epochs"]
        3
        """
        config = dataclasses.asdict(self)
        layers = config["data"]["augmentations"]
        if any(not isinstance(layer, dict) for layer in layers):
            import keras

            config["data"]["augmentations"] = [
                keras.layers.serialize(layer) if isinstance(layer, keras.layers.Layer) else layer
                for layer in self.data.augmentations
            ]
        return config

    @classmethod
    def from_dict(cls, config, where="TrainConfig.from_dict"):
        """The inverse of `to_dict`; also reads the flat `config.json` of keras-vit 0.1
        runs (`where`, e.g. the file, is named in the deprecation note). Unknown keys are
        an error naming them.

        Example:

        >>> TrainConfig.from_dict({"schedule": {"epochs": 3}}).schedule.epochs
        3
        """
        return cls(**sectioned(config, where))

    def flat_items(self):
        """`(dotted key, value)` of every setting, e.g. `("schedule.epochs", 1)`.

        Example:

        >>> dict(TrainConfig().flat_items())["data.batch_size"]
        512
        """
        for key, value in self.to_dict().items():
            if key in SECTIONS:
                for name, setting in value.items():
                    yield f"{key}.{name}", setting
            else:
                yield key, value


# --- the override language (`--set key=value`) ------------------------------------------

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def parse_value(key, text, kind):
    """`text` converted to the type `kind` of config field `key`, or ValueError.

    Example:

    >>> parse_value("schedule.updates", "none", Optional[int]) is None
    True
    >>> parse_value("data.crop_area", "(0.5, 1)", tuple)
    (0.5, 1)
    """
    args = typing.get_args(kind)
    if typing.get_origin(kind) is typing.Union and type(None) in args:
        if text.lower() in ("none", "null"):
            return None
        (kind,) = [a for a in args if a is not type(None)]
    try:
        if kind is bool:
            if text.lower() in _TRUE + _FALSE:
                return text.lower() in _TRUE
            raise ValueError
        if kind in (int, float, str):
            return kind(text)
        value = ast.literal_eval(text)
        if not isinstance(value, typing.get_origin(kind) or kind):
            raise ValueError
        return value
    except (ValueError, SyntaxError):
        expected = {bool: "true or false", int: "an integer", float: "a number"}.get(
            kind, f"a Python {getattr(kind, '__name__', kind)} literal"
        )
        raise ValueError(f"--set {key}={text}: {key} expects {expected}, got {text!r}.") from None


def _assign(config, path, text, key):
    """`config` (a dataclass) with the field at `path` (a list of names) set from `text`."""
    hints = typing.get_type_hints(type(config))
    name, rest = path[0], path[1:]
    prefix = key[: len(key) - len(".".join(path))]
    if name not in hints:
        raise ValueError(
            f"Unknown config key {prefix + name!r} in --set {key}={text}; valid keys: "
            f"{', '.join(prefix + h for h in sorted(hints))}."
        )
    kind = hints[name]
    if dataclasses.is_dataclass(kind):
        if not rest:
            raise ValueError(
                f"--set {key}={text}: {key} is a section; set one of its keys "
                f"({', '.join(f'{key}.{h}' for h in typing.get_type_hints(kind))})."
            )
        value = _assign(getattr(config, name), rest, text, key)
    elif rest:
        if kind is not dict:
            raise ValueError(f"--set {key}={text}: {prefix + name} is not a dict field.")
        try:
            entry = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            # The words the typed fields take (`remat=true`); anything else is a string.
            entry = {"true": True, "false": False, "none": None, "null": None}.get(
                text.lower(), text
            )
        value = {**getattr(config, name), ".".join(rest): entry}
    else:
        value = parse_value(key, text, kind)
    return dataclasses.replace(config, **{name: value})


def apply_overrides(config, assignments):
    """Returns `config` (a dataclass) with `key=value` assignments applied.

    Values are parsed by the field's type (`none` for optional fields; tuples, lists and
    dicts as Python literals); `section.key=value` sets a key of a section and
    `key.entry=value` one entry of a dict field. A flat key of keras-vit 0.1
    (`learning_rate=...`, `model_kwargs.num_layers=3`) is moved to its section with a
    deprecation note. The config passed in is left as it was.

    Example:

    >>> config = apply_overrides(TrainConfig(), ["schedule.epochs=3",
    ...     "data.crop_area=(0.5, 1.0)", "model.kwargs.dropout_rate=0.1"])
    >>> config.schedule.epochs, config.data.crop_area, config.model.kwargs
    (3, (0.5, 1.0), {'dropout_rate': 0.1})
    """
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"--set expects key=value, got {assignment!r}.")
        first, dot, rest = key.partition(".")
        section_key = dot and first in SECTIONS
        if isinstance(config, TrainConfig) and not section_key and is_flat_key(first, text):
            new = FLAT_KEYS[first] + dot + rest
            logger.warning("--set %s: flat key %r is deprecated, use %r.", assignment, key, new)
            key = new
        config = _assign(config, key.split("."), text, key)
    return config
