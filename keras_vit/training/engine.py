"""The training engine: `train(config)` runs a `TrainConfig` with a normal `model.fit` inside.

`train` is a list of steps, each a function below: check the run and find where a
backup left it, make the strategy, load the sources, plan the run's length, build the
input pipelines, build and compile the model (in the strategy's scope), make the
callbacks, fit, and write the final model and metrics to the run's output folder (see
`keras_vit.training.runs`). TensorFlow backend (tf.data, tf.distribute), or JAX
(tf.data, `keras.distribution`; several processes: `keras_vit.training.jax_processes`).
"""

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import time

import keras
import tensorflow as tf

from keras_vit import data as vit_data
from keras_vit.models import mpp as vit_mpp
from keras_vit.models import size
from keras_vit.models.architecture import Architecture
from keras_vit.models.preprocessing import DEFAULT, check_preprocessing
from keras_vit.models.vit import VisionTransformer, vit_parts
from keras_vit.training import distribute, multiworker, runs
from keras_vit.training.callbacks import (
    EpochCheckpoints,
    EpochLog,
    StopOnSignal,
    TerminateOnNotFinite,
    TrainingBackup,
    not_finite,
    one_host_model,
)
from keras_vit.training.config import TrainConfig  # noqa: F401  (keras_vit.training.engine.TrainConfig)
from keras_vit.training.config import check_training_backend
from keras_vit.training.losses import SigmoidCrossEntropy
from keras_vit.training.optimizers import make_optimizer
from keras_vit.training.schedules import WarmupDecay
from keras_vit.utils.serialization import serializable
from keras_vit.utils.files import atomic_path, atomic_write, remove_temporaries
from keras_vit.utils.keras_compat import progress_verbosity
from keras_vit.utils.model_files import read_keras

logger = logging.getLogger("keras_vit")


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

        def train_function(*args):  # (iterator), or on JAX (state, iterator)
            if getattr(self, "_calls_to_pass", 0):
                self._calls_to_pass -= 1
                # On JAX the model's variables are fit's state meanwhile: no logs to read.
                return self.get_metrics_result() if len(args) == 1 else ({}, args[0])
            return step_function(*args)

        train_function.passes_steps = True
        self.train_function = train_function
        return train_function


@serializable
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
        trainer = cls(inputs=model.inputs, outputs=model.outputs, name=model.name)
        # A dataclass, which Keras does not track: the layers are the trainer's already.
        trainer._parts = getattr(model, "parts", None)
        return trainer

    @property
    def parts(self):
        """The wrapped ViT's `ViTParts` (None for another model)."""
        return getattr(self, "_parts", None)

    def kernels(self):
        """The matrix kernels weight decay applies to: the wrapped ViT's."""
        return vit_parts(self).kernels()


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


class TrainingFailed(RuntimeError):
    """A run stopped by a failure once training was under way (a full disk, ...).

    Its message says what failed and that rerunning resumes; the `keras-vit` command
    exits with `exit_code` 1 on it (2 for bad input).
    """

    exit_code = 1


class TrainingInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C (or SIGTERM, as the `keras-vit` command makes it); its
    message says where the run stopped, from where rerunning resumes it."""


@dataclasses.dataclass
class TrainResult:
    """What `train` returns: the trained model, the history of every epoch (across
    restarts) and the final metrics."""

    model: keras.Model
    history: dict
    metrics: dict
    out: str


@dataclasses.dataclass
class Sources:
    """The run's data sources: `train`, `eval` (None without evaluation), `skipped` files
    and those kept that decode with a libjpeg warning (`warned`, `{path: warning}`)."""

    train: object
    eval: object
    skipped: list
    warned: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Plan:
    """The run's length: `epochs` of `micro_batches_per_epoch`, `updates` optimizer
    updates, the first `warmup_updates` of them warming up."""

    epochs: int
    micro_batches_per_epoch: int
    updates: int
    warmup_updates: int


def check_run(config):
    """Validates `config` for a run on this backend; raises `ValueError` naming what is wrong."""
    config.validate()
    check_memory(config)
    check_training_backend(keras.backend.backend())
    runs.check_run_folder(config.out)
    init_from = config.model.init_from
    if init_from:
        # Before anything is written: a missing file or an unreachable URL is bad input.
        weights = runs.resolve_from(init_from).path
        if not tf.io.gfile.exists(weights):
            raise FileNotFoundError(f"model.init_from (--from) {init_from!r} does not exist.")
        # Resolved, so that a link or `..` in either cannot hide the one inside the other.
        weights = os.path.realpath(weights)
        if weights.startswith(os.path.realpath(config.out) + os.sep):
            raise ValueError(
                f"out={config.out!r} holds the model.init_from weights {weights!r}: the run "
                "would overwrite them; pick another output folder."
            )


def run_architecture(config):
    """The `Architecture` of the run's model (its head and preprocessing left out; NaFlex
    and packing as the data asks)."""
    model = config.model
    fields = {field.name for field in dataclasses.fields(Architecture)} - {"preprocessing"}
    return Architecture(
        None if model.variant == "custom" else model.variant,
        image_size=model.image_size, channels=model.channels,
        **{k: v for k, v in model.kwargs.items() if k in fields}, **naflex_arguments(config),
    )


def naflex_arguments(config):
    """The model arguments a NaFlex run's data asks for (`data.naflex`, packed with
    `data.images_per_row`), else none."""
    if not config.data.naflex:
        return {}
    return dict(naflex=True, images_per_row=config.data.images_per_row)


# Optimizer state per weight (Adam's two moments, SGD's momentum).
OPTIMIZER_SLOTS = {"adam": 2, "adamw": 2, "sgd": 1}


def check_memory(config):
    """Raises `ValueError` with the estimate when the run's model cannot be trained in the
    machine's memory (`keras_vit.models.size`: its weights, their gradients and optimizer
    state, a micro-batch's activations; the head, whose classes the data decides, left
    out), before any of it is built."""
    optimization = config.optimization
    arch = run_architecture(config)
    parameters = arch.parameter_count(num_classes=0)
    slots = OPTIMIZER_SLOTS.get(optimization.optimizer, 0)
    if optimization.optimizer == "sgd" and not optimization.momentum:
        slots = 0
    weights = parameters * 4 * (2 + slots)  # float32 weights and gradients, and the slots
    bytes_per_value = 4 if config.distribution.precision == "float32" else 2
    patches = None
    if config.data.naflex:  # rows of the layout's tokens, not of the model's image size
        layout = config.data.naflex_layout(arch.patch_size)
        patches = layout.row_tokens if layout.images_per_row else layout.max_num_patches
    activations = config.micro_batch_size * arch.activation_values(patches) * bytes_per_value
    size.check_fits(
        weights + activations,
        f"Training this model ({parameters:,} parameters; {weights / size.GB:,.1f} GB for "
        f"them, their gradients and {optimization.optimizer} state, "
        f"{activations / size.GB:,.1f} GB for a micro-batch of {config.micro_batch_size} "
        "images' activations)",
        "make the model smaller (model.kwargs.num_layers, hidden_dim, mlp_dim, "
        "model.image_size) or the micro-batch (data.batch_size, "
        "optimization.micro_batches_per_update), or set model.kwargs.remat=true.",
    )


# Settings a resumed run may change: where it runs and what it logs, not what it computes.
RESUME_MAY_CHANGE = (
    "out", "distribution.strategy", "checkpointing.tensorboard", "checkpointing.keep_checkpoints",
    "distribution.coordinator", "distribution.num_processes", "distribution.process_id",
    "distribution.join_timeout",
)


def check_resumable(config, out, what="an unfinished"):
    """A run folder's backup may only be resumed (and a finished run only be reported
    finished) for the configuration that wrote it; `what` names the run in the error."""
    path = os.path.join(out, runs.CONFIG)
    if not tf.io.gfile.exists(path):
        return
    with tf.io.gfile.GFile(path) as f:
        saved = TrainConfig.from_dict(json.load(f), where=path)

    def settings(run_config):
        return dict(json.loads(json.dumps(list(run_config.flat_items()))))

    saved, current = settings(saved), settings(config)
    changed = sorted(k for k in current if k not in RESUME_MAY_CHANGE and saved[k] != current[k])
    if changed:
        raise ValueError(
            f"{out} holds {what} run whose config differs in {changed}; run it with the same "
            "settings, start it over (--restart, or train(restart=True)), or pick another "
            "output folder."
        )


def resume_position(config):
    """`(epoch, micro_batch)` where the run's backup left it; `(0, 0)` for a new run."""
    position = TrainingBackup.saved_position(os.path.join(config.out, runs.BACKUP))
    if runs.status(config.out) == "unfinished":
        check_resumable(config, config.out)
    return position


def make_strategy(config):
    """Seeds the run and makes its `tf.distribute` strategy; on JAX, joins the run's
    processes and sets its `keras.distribution` (`keras_vit.training.jax_processes`)."""
    if keras.backend.backend() == "jax":
        from keras_vit.training import jax_processes

        jax_processes.join(config.distribution, list(config.flat_items()))
        keras.utils.set_random_seed(config.seed)
        return jax_processes.make_distribution(config.distribution.strategy)
    if config.distribution.strategy not in distribute.STRATEGIES:
        raise ValueError(
            f"distribution.strategy {config.distribution.strategy!r} runs on the JAX backend: "
            "set KERAS_BACKEND=jax."
        )
    keras.utils.set_random_seed(config.seed)
    if config.distribution.deterministic:
        tf.config.experimental.enable_op_determinism()
    return distribute.make_strategy(config.distribution.strategy)


def output_path(config, strategy, name):
    """Where the run writes file `name`: only the chief writes the run folder (see
    `keras_vit.training.multiworker`), other workers write to a temporary folder."""
    return multiworker.write_path(os.path.join(config.out, name), strategy)


def _write_json(path, value):
    atomic_write(path, json.dumps(value, indent=2, default=float))


@contextlib.contextmanager
def hold_folder(config, written, restart):
    """Holds the run folder (`runs.hold`: one run at a time) while the body runs, after
    deleting the temporary files of killed writers and, with `restart`, what an earlier
    run wrote. Yields the `TrainResult` of the finished run the folder holds (same
    config required), or None when there is a run to do."""
    tf.io.gfile.makedirs(config.out)
    folder = os.path.dirname(written(runs.LOCK))  # other workers: their own temporary one
    with runs.hold(folder):
        for path in remove_temporaries(folder, skip=(multiworker.WORKER_TEMP,)):
            logger.info("Removed %s, left by a run killed while writing it.", path)
        if restart and written(runs.LOCK) == os.path.join(config.out, runs.LOCK):
            runs.clear(config.out)
        elif runs.status(config.out) == "finished":
            check_resumable(config, config.out, "a finished")
            logger.info(
                "%s holds this finished run: nothing to do (--restart, or train(restart=True), "
                "trains it again).", config.out,
            )
            yield finished_result(config.out)
            return
        yield None


def finished_result(out):
    """The `TrainResult` of the finished run in `out`, read back from its files."""
    with tf.io.gfile.GFile(os.path.join(out, runs.METRICS_JSON)) as f:
        metrics = json.load(f)
    model = read_keras(os.path.join(out, runs.MODEL))
    return TrainResult(model=model, history=metrics["history"], metrics=metrics["final"], out=out)


def write_config(config, written):
    """Writes the run's `config.json`."""
    _write_json(written(runs.CONFIG), config.to_dict())


def describe_strategy(strategy):
    """One line naming the run's strategy and its devices, for logs and `metrics.json`."""
    if multiworker.on_jax(strategy):
        from keras_vit.training.jax_processes import describe

        return describe(strategy)
    return distribute.describe(strategy)


def precision_and_xla(config, strategy):
    """The dtype policy and whether to compile with XLA, as `config.distribution` and
    the strategy's devices allow."""
    distribution = config.distribution
    if multiworker.on_jax(strategy):
        from keras_vit.training import jax_processes

        policy, jit = jax_processes.precision_policy(distribution.precision), True
    else:
        policy = distribute.precision_policy(distribution.precision, strategy)
        jit = distribute.jit_allowed(strategy)
    jit = {"on": True, "off": False}.get(distribution.jit_compile, jit)
    logger.info("Strategy %s; precision %s; XLA %s.", describe_strategy(strategy), policy, jit)
    return policy, jit


def _eval_source(config):
    evaluation, data = config.evaluation, config.data
    if not evaluation.enabled:
        return None
    if evaluation.source:
        return vit_data.load_source(
            evaluation.source, "test", strict=data.strict, data_dir=data.data_dir
        )
    if vit_data.spec_split(data.source):
        logger.warning(
            "No evaluation data: data.source names its split; set evaluation.source to evaluate."
        )
        return None
    try:
        return vit_data.load_source(data.source, "test", strict=data.strict, data_dir=data.data_dir)
    except vit_data.NoSplitError as error:
        logger.warning("No evaluation data: %s Set evaluation.source to evaluate.", error)
        return None


def load_sources(config, written):
    """The train and eval sources (with `data.classes` selected); writes the class names
    in `labels.txt` and lists undecodable files in `skipped_files.txt` (keeping those a
    resumed run's earlier sessions met while training, as the files kept with a libjpeg
    warning they named: `record_files`)."""
    data = config.data
    train_source = vit_data.load_source(
        data.source, "train", strict=data.strict, data_dir=data.data_dir
    )
    eval_source = _eval_source(config)
    if config.data.classes is not None:
        train_source = vit_data.select_classes(train_source, config.data.classes)
        eval_source = eval_source and vit_data.select_classes(eval_source, config.data.classes)
    note = vit_data.channel_note(train_source, config.model.channels)
    if note:
        logger.info(note)
    if train_source.class_names:
        atomic_write(written(runs.LABELS), "\n".join(train_source.class_names) + "\n")
    skipped = train_source.skipped + (eval_source.skipped if eval_source else [])
    earlier = written(runs.SKIPPED_FILES)
    if tf.io.gfile.exists(earlier):  # a resumed run: with the files its sessions met
        with tf.io.gfile.GFile(earlier) as f:
            skipped = list(dict.fromkeys(skipped + f.read().splitlines()))
    if skipped:
        atomic_write(written(runs.SKIPPED_FILES), "\n".join(skipped) + "\n")
    warned = {}
    earlier = written(runs.KEPT_WITH_WARNINGS)
    if tf.io.gfile.exists(earlier):
        with tf.io.gfile.GFile(earlier) as f:
            warned = dict(line.split("\t", 1) for line in f.read().splitlines() if "\t" in line)
    return Sources(train=train_source, eval=eval_source, skipped=skipped, warned=warned)


def record_files(sources, written):
    """Adds the files the pipelines failed to decode so far (`Source.undecodable`) to
    `sources.skipped`, and those the libjpeg checks named (`Source.libjpeg`) to
    `sources.warned`, rewriting `skipped_files.txt` / `kept_with_warnings.txt` when there
    are new ones."""
    chosen = [source for source in (sources.train, sources.eval) if source]
    met = [name for source in chosen for name in list(source.undecodable)]
    new = [name for name in dict.fromkeys(met) if name not in sources.skipped]
    if new:
        sources.skipped.extend(new)
        atomic_write(written(runs.SKIPPED_FILES), "\n".join(sources.skipped) + "\n")
    warned = {path: message for source in chosen if source.libjpeg
              for path, message in list(source.libjpeg.warned.items())}
    if any(path not in sources.warned for path in warned):
        sources.warned.update(warned)
        atomic_write(written(runs.KEPT_WITH_WARNINGS), "".join(
            f"{path}\t{message}\n" for path, message in sources.warned.items()))


@contextlib.contextmanager
def libjpeg_checks(sources):
    """Runs the sources' `keras_vit.data.libjpeg.BackgroundCheck`s (local image folders)
    while the block runs: off the start-up path, they only name files."""
    checks = [source.libjpeg for source in (sources.train, sources.eval)
              if source and source.libjpeg]
    for check in checks:
        check.start()
    try:
        yield
    finally:
        for check in checks:
            check.stop()


def plan_run(config, train_source):
    """The run's epochs, micro-batches per epoch and optimizer updates."""
    schedule = config.schedule
    per_update = config.optimization.micro_batches_per_update
    per_execution = config.distribution.micro_batches_per_execution
    micro_batch = config.micro_batch_size
    per_epoch = schedule.micro_batches_per_epoch or train_source.size // micro_batch
    if per_epoch < 1:
        raise ValueError(
            f"batch_size {micro_batch} per micro-batch is larger than the {train_source.size} "
            f"training examples of {train_source.name}."
        )
    per_epoch -= per_epoch % per_execution
    if schedule.updates:
        epochs = math.ceil(schedule.updates * per_update / per_epoch)
    else:
        epochs = schedule.epochs
    updates = epochs * per_epoch // per_update
    if updates < 1:
        raise ValueError(
            f"The run makes no optimizer update: {epochs} epochs of {per_epoch} micro-batches, "
            f"{per_update} per update; train longer or accumulate fewer micro-batches."
        )
    warmup = schedule.warmup_updates
    if warmup >= updates:  # As Keras' CosineDecay, timm and HF's Trainer, train anyway.
        logger.warning(
            "schedule.warmup_updates %d does not fit the run's %d optimizer updates: warming "
            "up over %d (half the run) instead.", warmup, updates, updates // 2,
        )
        warmup = updates // 2
    return Plan(
        epochs=epochs, micro_batches_per_epoch=per_epoch, updates=updates, warmup_updates=warmup
    )


def run_preprocessing(config):
    """The preprocessing of a run: `model.kwargs["preprocessing"]`, else what the
    `model.init_from` weights expect (`Source.preprocessing` of `runs.resolve_from`: a
    DeiT's ImageNet mean and std, what a `.keras` model or run was built with), else
    None (pixels scaled to [-1, 1]); a NaFlex run's with `naflex_inputs`' resize
    (bilinear, antialiased, no crop). The pipelines normalise with it and the run's
    model records it."""
    model = config.model
    preprocessing = model.kwargs.get("preprocessing")
    if preprocessing is None and model.init_from:
        preprocessing = runs.resolve_from(model.init_from).preprocessing
    if config.data.naflex:
        # Its images are resized as `naflex_inputs` resizes them, whole: its model says so.
        preprocessing = {**check_preprocessing(preprocessing or DEFAULT),
                         **{k: vit_data.naflex.SIGLIP2_PREPROCESSING[k]
                            for k in ("interpolation", "antialias", "crop_fraction")}}
    return preprocessing


def make_pipelines(config, sources, plan, strategy, position):
    """The train and eval `tf.data` pipelines (per worker under `multiworker`); the
    train stream starts at the micro-batch `position` (epoch, micro-batch) resumes at.
    A NaFlex run's (`data.naflex`) take each image at its own aspect, in padded or
    packed batches (`keras_vit.data.naflex_pipelines`)."""
    data, model = config.data, config.model
    epoch0, step0 = position

    # What both pipelines take alike: image size (or NaFlex layout), micro-batch,
    # channels, caching and the pixel normalisation the weights expect.
    shared = dict(
        image_size=model.image_size, batch_size=config.micro_batch_size,
        channels=model.channels, cache=data.cache, preprocessing=run_preprocessing(config),
        naflex=data.naflex_layout(run_architecture(config).patch_size) if data.naflex else None,
    )

    def make_train(input_context=None):
        return vit_data.train_dataset(
            sources.train,
            seed=config.seed,
            inception_crop=data.inception_crop,
            crop_area=data.crop_area,
            random_flip=data.random_flip,
            augment=data.augment,
            randaugment=data.randaugment,
            mixup=data.mixup,
            cutmix=data.cutmix,
            layers=data.augmentations,
            shuffle_buffer=data.shuffle_buffer,
            start_batch=epoch0 * plan.micro_batches_per_epoch + step0,
            input_context=input_context,
            **shared,
        )

    def make_eval(input_context=None):
        return vit_data.eval_dataset(
            sources.eval,
            crop_fraction=config.evaluation.crop_fraction,
            input_context=input_context,
            **shared,
        )

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        train_data = strategy.distribute_datasets_from_function(make_train)
        eval_data = sources.eval and strategy.distribute_datasets_from_function(make_eval)
    else:  # On JAX each process reads its share of each global batch.
        context = None
        if multiworker.on_jax(strategy):
            from keras_vit.training.jax_processes import input_context

            context = input_context(sources.eval.size if sources.eval else 0)
        train_data = make_train(context)
        eval_data = sources.eval and make_eval(context)
    return train_data, eval_data


def _build_model(config, num_classes):
    """The ViT `config.model` describes (headless for masked patch prediction)."""
    model, optimization = config.model, config.optimization
    head_bias = model.head_bias_init
    if head_bias is None:
        head_bias = -10.0 if optimization.loss == "sigmoid" else 0.0
    variant = None if model.variant == "custom" else model.variant
    return VisionTransformer(
        variant,
        image_size=model.image_size,
        num_classes=num_classes,
        channels=model.channels,
        head_bias_init=head_bias,
        include_top=optimization.objective == "supervised",
        **{**model.kwargs, **naflex_arguments(config), "preprocessing": run_preprocessing(config)},
    )


def make_loss(config):
    """The supervised loss of a run; over packed NaFlex rows (`data.images_per_row`)
    the mean over the real images (slots of sample weight 1), whatever the rows' fill.

    Example:

    >>> make_loss(TrainConfig()).reduction
    'sum_over_batch_size'
    """
    optimization = config.optimization
    reduction = "sum_over_batch_size"
    if config.data.images_per_row is not None:
        reduction = "mean_with_sample_weight"
    if optimization.loss == "sigmoid":
        return SigmoidCrossEntropy(reduction=reduction)
    return keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=optimization.label_smoothing, reduction=reduction
    )


def _objective(config, network, num_classes):
    """The model `fit` trains around `network`, and its `compile` arguments."""
    optimization = config.optimization
    if optimization.objective == "mpp":
        model = MaskedPatchTraining(
            network,
            bits=optimization.mpp_bits,
            corrupt_rate=optimization.mpp_corrupt_rate,
            mask_rate=optimization.mpp_mask_rate,
            random_rate=optimization.mpp_random_rate,
            seed=config.seed,
        )
        return model, {}  # It computes its loss and masked-patch accuracy itself.
    loss = make_loss(config)
    metrics = [keras.metrics.CategoricalAccuracy(name="top1")]
    if num_classes > 5:
        metrics.append(keras.metrics.TopKCategoricalAccuracy(k=5, name="top5"))
    return TrainingModel.wrap(network), dict(loss=loss, metrics=metrics)


def _make_optimizer(config, model, plan):
    schedule, optimization = config.schedule, config.optimization
    learning_rate = WarmupDecay(
        schedule.learning_rate,
        total_steps=plan.updates,
        warmup_steps=plan.warmup_updates,
        decay=schedule.decay,
        end_learning_rate=schedule.end_learning_rate,
        accumulation_steps=optimization.micro_batches_per_update,
    )
    return make_optimizer(
        optimization.optimizer,
        learning_rate,
        model,
        weight_decay=optimization.weight_decay,
        momentum=optimization.momentum,
        beta_2=optimization.beta_2,
        clip_norm=optimization.clip_norm,
        accumulation_steps=optimization.micro_batches_per_update,
    )


def build_and_compile(config, num_classes, plan, strategy, policy, jit):
    """The ViT (loaded from `model.init_from` if set) and the compiled model `fit`
    trains around it, built in the strategy's scope under the dtype `policy`."""
    previous_policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        with strategy.scope():
            vit = _build_model(config, num_classes)
            if config.model.init_from:
                logger.info(
                    runs.load_weights(
                        vit, config.model.init_from, interpolation=config.model.interpolation
                    )
                )
            if config.model.lora_rank:
                from keras_vit.training.lora import enable_lora

                counts = enable_lora(vit, config.model.lora_rank)
                logger.info(
                    "LoRA rank %d on %d Dense layers: %d of %d parameters trainable (%.1f%%).",
                    config.model.lora_rank, counts["layers"], counts["trainable"],
                    counts["total"], 100 * counts["trainable"] / counts["total"],
                )
            model, objective = _objective(config, vit, num_classes)
            model.compile(
                optimizer=_make_optimizer(config, model, plan),
                jit_compile=jit,
                steps_per_execution=config.distribution.micro_batches_per_execution,
                **objective,
            )
    finally:
        keras.config.set_dtype_policy(previous_policy)
    return vit, model


def make_callbacks(config, vit, written, initial_epoch):
    """The engine's callbacks: checkpoints, metrics (CSV, TensorBoard), backup, NaN stop,
    signal stop.

    At an epoch's end the checkpoint and the metrics are written before the backup that
    counts the epoch as done: a kill in between repeats the epoch, which replaces them."""
    checkpointing = config.checkpointing
    logs_dir = None
    if checkpointing.tensorboard:
        try:
            import tensorboard  # noqa: F401  (tf.summary writes nothing without it)

            logs_dir = written(runs.LOGS)
        except ImportError:
            logger.warning("TensorBoard is not installed (pip install tensorboard): no logs/.")
    return [
        EpochCheckpoints(
            vit, os.path.join(config.out, runs.CHECKPOINTS), keep=checkpointing.keep_checkpoints
        ),
        EpochLog(written(runs.METRICS_CSV), logs_dir, initial_epoch=initial_epoch),
        TrainingBackup(
            os.path.join(config.out, runs.BACKUP), every=checkpointing.backup_every_micro_batches
        ),
        TerminateOnNotFinite(),
        StopOnSignal(),
    ]


def fit(config, model, pipelines, plan, initial_epoch, callbacks, verbose):
    """`model.fit` over the plan; returns the history of every epoch of the run (across
    restarts, from its `EpochLog`) and the seconds it took. Raises `FloatingPointError`
    naming the last good checkpoint when the loss or a metric (evaluation's too) is not
    finite."""
    train_data, eval_data = pipelines
    start = time.time()
    try:
        model.fit(
            train_data,
            epochs=plan.epochs,
            steps_per_epoch=plan.micro_batches_per_epoch,
            initial_epoch=initial_epoch,
            validation_data=eval_data or None,
            validation_freq=config.evaluation.every_epochs,
            callbacks=callbacks,
            shuffle=False,  # The stream is shuffled (and seeded) by the pipeline.
            verbose=progress_verbosity(verbose),
        )
    except (OSError, tf.errors.OpError) as error:
        reason = error.message if isinstance(error, tf.errors.OpError) else error
        if isinstance(error, OSError) and error.strerror:
            reason = f"{error.strerror}: {error.filename!r}" if error.filename else error.strerror
        done = TrainingBackup.saved_position(os.path.join(config.out, runs.BACKUP))
        raise TrainingFailed(
            f"Training stopped: {' '.join(str(reason).split())}. Once that is fixed, the same "
            f"command resumes the run from its backup (epoch {done[0] + 1}, micro-batch "
            f"{done[1]})."
        ) from error
    seconds = time.time() - start
    (epoch_log,) = [c for c in callbacks if isinstance(c, EpochLog)]
    if epoch_log.rows:
        last = epoch_log.rows[-1]
        check_finite(config, {k: v for k, v in last.items() if k != "epoch"},
                     f"in epoch {last['epoch'] + 1}")
    return epoch_log.history(), seconds


def check_finite(config, metrics, when):
    """Raises `FloatingPointError` naming the metrics that are not finite (`when`: where
    they were measured) and the last good checkpoint and backup of the run."""
    bad = not_finite(metrics)
    if not bad:
        return
    last_good = runs.latest_checkpoint(config.out)
    backup = os.path.join(config.out, runs.BACKUP, TrainingBackup.FILE)
    state = (
        f"the backup {backup} holds the last good training state"
        if tf.io.gfile.exists(backup)
        else "no backup was written yet: lower the learning rate and start over (--restart)"
    )
    values = ", ".join(f"{name} {metrics[name]}" for name in bad)
    raise FloatingPointError(
        f"Training stopped: {values} {when}. Last good checkpoint: {last_good or 'none'}; "
        f"{state}."
    )


def write_results(config, model, vit, eval_data, written, record):
    """Evaluates the final model (raising `FloatingPointError` if a metric is not
    finite: the run is not finished), saves it, writes `metrics.json` (`record` plus the
    final metrics); returns the final metrics. Only then is the backup removed: the
    run is finished once these files are in place."""
    final = model.evaluate(eval_data, verbose=0, return_dict=True) if eval_data else {}
    check_finite(config, final, "in the final evaluation")
    with atomic_path(written(runs.MODEL)) as path:
        one_host_model(vit).save(path)
    _write_json(written(runs.METRICS_JSON), dict(final=final, **record))
    if multiworker.is_chief(multiworker.model_strategy(model)):
        TrainingBackup.remove(os.path.join(os.path.dirname(written(runs.MODEL)), runs.BACKUP))
    return final


def train(config, *, callbacks=(), verbose="auto", restart=False):
    """Trains a ViT as `config` says, writing the run under `config.out`.

    With `optimization.objective="mpp"` the model trained is `MaskedPatchTraining` around
    a headless ViT, and that encoder is what the run saves (`model.keras`, checkpoints),
    ready for fine-tuning or few-shot evaluation with `--from`.

    The run holds its output folder (`keras_vit.training.runs.hold`: a second run into
    it is refused). A folder with an unfinished run's backup resumes it exactly where
    it was, however it was stopped (same config required); a finished run is not
    trained again: its result is read back (same config required) unless `restart`,
    which deletes what the run wrote and starts over. Every file is written atomically,
    each epoch's metrics once (see `keras_vit.training.callbacks`). A
    `schedule.warmup_updates` that does not fit the run is shortened to half of it
    (logged). Returns a `TrainResult`; raises `FloatingPointError` (naming the last good
    checkpoint) when the loss becomes NaN or infinite, and on Ctrl-C `TrainingInterrupted`
    (a `KeyboardInterrupt`) saying where the run stopped.

    Args:
        config: a `TrainConfig`.
        callbacks: more Keras callbacks for `fit`.
        verbose: `fit`'s verbosity (progress bar: 1; `"auto"`: a bar on a terminal,
            a line per epoch otherwise).
        restart: start over, even if `config.out` holds an unfinished or finished run.

    Example:

    >>> import tempfile
    >>> from keras_vit.training.config import ModelConfig, DataConfig, ScheduleConfig
    >>> config = TrainConfig(
    ...     model=ModelConfig(variant="custom", kwargs=dict(patch_size=4, hidden_dim=16,
    ...         num_layers=1, num_heads=2, mlp_dim=32), image_size=8, channels=1),
    ...     data=DataConfig(batch_size=256), schedule=ScheduleConfig(epochs=1),
    ...     checkpointing=dict(tensorboard=False), out=tempfile.mkdtemp())
    >>> result = train(config, verbose=0)
    >>> sorted(result.metrics)
    ['loss', 'top1', 'top5']
    >>> train(config, verbose=0).metrics == result.metrics  # finished: read back
    True
    """
    check_run(config)
    strategy = make_strategy(config)
    written = functools.partial(output_path, config, strategy)
    with hold_folder(config, written, restart) as finished:
        if finished:
            return finished
        try:
            return _run(config, strategy, written, callbacks, verbose)
        except KeyboardInterrupt as error:
            epoch, step = TrainingBackup.saved_position(os.path.join(config.out, runs.BACKUP))
            where = (
                f"its backup resumes it at epoch {epoch + 1}, micro-batch {step}"
                if runs.status(config.out) == "unfinished"
                else "no backup was written yet: it starts again"
            )
            raise TrainingInterrupted(
                f"Interrupted: the run in {config.out} stopped; {where}."
            ) from error


def _run(config, strategy, written, callbacks, verbose):
    """The steps of `train` in the run folder it holds."""
    if multiworker.on_jax(strategy):
        from keras_vit.training.jax_processes import barrier

        barrier("run folder ready")  # Process 0 has cleared it (restart) before any reads it.
    position = resume_position(config)
    write_config(config, written)
    if not multiworker.on_jax(strategy):
        per_execution = distribute.micro_batches_per_execution(
            config.distribution.micro_batches_per_execution, strategy
        )
        config = config.replace(distribution=dict(micro_batches_per_execution=per_execution))
    policy, jit = precision_and_xla(config, strategy)
    sources = load_sources(config, written)
    with libjpeg_checks(sources):
        plan = plan_run(config, sources.train)
        pipelines = make_pipelines(config, sources, plan, strategy, position)
        vit, model = build_and_compile(config, sources.train.num_classes, plan, strategy, policy, jit)
        engine_callbacks = make_callbacks(config, vit, written, initial_epoch=position[0])
        # Files that fail to decode while training, and those the libjpeg checks name, are
        # listed at each epoch's end.
        files = keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: record_files(sources, written)
        )
        history, seconds = fit(
            config, model, pipelines, plan, position[0],
            [files] + engine_callbacks + list(callbacks), verbose,
        )
        record_files(sources, written)
        final = write_results(
            config, model, vit, pipelines[1], written,
            dict(
                history=history,
                epochs=plan.epochs,
                steps_per_epoch=plan.micro_batches_per_epoch,
                optimizer_updates=plan.updates,
                warmup_updates=plan.warmup_updates,
                train_examples=sources.train.size,
                eval_examples=sources.eval.size if sources.eval else 0,
                skipped_files=sources.skipped,
                kept_with_warnings=sources.warned,
                seconds=seconds,
                strategy=describe_strategy(strategy),
                precision=policy,
                jit_compile=jit,
            ),
        )
        if not multiworker.is_chief(strategy):  # Its copies of the run's files were temporary.
            tf.io.gfile.rmtree(os.path.dirname(written(runs.MODEL)))
        return TrainResult(model=vit, history=history, metrics=final, out=config.out)
