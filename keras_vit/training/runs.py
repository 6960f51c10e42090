"""What a training run writes under its output folder, and finding weights again (`--from`).

```
OUT/config.json             the run's configuration
OUT/labels.txt              class names, one per line (when the data names its classes)
OUT/skipped_files.txt       files of the data that could not be decoded (when there are any)
OUT/kept_with_warnings.txt  files of the data kept that decode with a libjpeg warning, each
                            `path<TAB>warning` (when there are any)
OUT/model.keras             the final model
OUT/checkpoints/epoch_NNNN.keras  each epoch's model (epoch_NNNN.orbax/: its shards, when the
                            weights are split over devices)
OUT/backup/state.npz        full training state while the run is unfinished
OUT/backup/sharded_*/       its arrays, when the weights are split over devices (Orbax)
OUT/metrics.csv             one row per epoch; OUT/metrics.json: history + final eval
OUT/logs/                   TensorBoard (one events file per epoch)
OUT/.lock                   held by the run writing the folder (`hold`)
```

Every file is written atomically (`keras_vit.utils.files`). A run is *finished* once its
`metrics.json` is written and its backup removed (`status`). A run starts only in a new
folder or a run's (`check_run_folder`): one that holds these names without a run's
`config.json` is someone else's.
"""

import contextlib
import json
import logging
import os
import socket
import tempfile

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; runs are then not kept apart.
    fcntl = None

from keras_vit import data as vit_data
from keras_vit.models.preprocessing import model_preprocessing
from keras_vit.models.architecture import ARCHITECTURE, FAMILY_DEFAULTS
from keras_vit.training.callbacks import EpochCheckpoints, TrainingBackup
from keras_vit.training.config import TrainConfig
from keras_vit.utils import paths
from keras_vit.utils.model_files import DamagedModel, read_keras
from keras_vit.weights.pretrained import NotFiniteWeights, load_pretrained, pretrained
from keras_vit.weights.sources import Source, resolve_source

logger = logging.getLogger(__name__)

CONFIG = "config.json"
MODEL = "model.keras"
CHECKPOINTS = "checkpoints"
BACKUP = "backup"
METRICS_CSV = "metrics.csv"
METRICS_JSON = "metrics.json"
LOGS = "logs"
LOCK = ".lock"
LABELS = "labels.txt"
SKIPPED_FILES = "skipped_files.txt"
KEPT_WITH_WARNINGS = "kept_with_warnings.txt"
# Folders keras-vit writes that hold no model of their own (`check_not_a_results_folder`).
DEMO_STAGES = {"finetune": "the fine-tuned model", "pretrain": "the pretrained one"}
FEWSHOT_RESULTS = "fewshot.json"


class RunFolderBusy(RuntimeError):
    """Another process holds the run folder (see `hold`)."""


@contextlib.contextmanager
def hold(folder):
    """Holds the run folder `folder` for this process while the body runs.

    One run at a time may write a folder: the lock is an advisory `flock` on
    `folder/.lock`, which the operating system releases when its process ends, however
    it ends, so a killed run never leaves its folder locked. A second holder is refused
    with `RunFolderBusy` naming the first (its pid and host). Folders on other
    filesystems (`gs://`) and systems without `fcntl` are not locked.

    Example:

    >>> folder = tempfile.mkdtemp()
    >>> with hold(folder):
    ...     with hold(folder):
    ...         pass  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    keras_vit.training.runs.RunFolderBusy: ... is in use by another run (pid ...
    """
    if fcntl is None or paths.is_url(folder):
        yield
        return
    descriptor = os.open(os.path.join(folder, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 200, 0).decode(errors="replace").strip()
            raise RunFolderBusy(
                f"{folder} is in use by another run ({holder or 'a process starting up'}); "
                "wait for it to end, or pick another output folder."
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield
    finally:
        os.close(descriptor)


def status(folder):
    """`"new"` (nothing to resume), `"unfinished"` (a backup to resume) or `"finished"`.

    Example:

    >>> status("/tmp/no-such-run")
    'new'
    """
    if paths.exists(os.path.join(folder, BACKUP, TrainingBackup.FILE)):
        return "unfinished"
    if paths.exists(os.path.join(folder, METRICS_JSON)) and paths.exists(
        os.path.join(folder, MODEL)
    ):
        return "finished"
    return "new"


# What a run writes under these names (`clear` deletes them): a folder that holds any
# without a run's config.json is no run of keras-vit's (`check_run_folder`).
RUN_ENTRIES = (CONFIG, LABELS, MODEL, CHECKPOINTS, BACKUP, METRICS_CSV, METRICS_JSON, LOGS,
               SKIPPED_FILES, KEPT_WITH_WARNINGS)


def check_run_folder(folder):
    """Raises `ValueError` naming what it holds when `folder` holds files under the names
    a run writes (its checkpoints/, logs/, config.json, ...) but no keras-vit run's
    `config.json`: a run there would write over them (and `--restart` delete them).

    Example:

    >>> folder = tempfile.mkdtemp()
    >>> check_run_folder(folder)  # new: nothing to lose
    >>> os.makedirs(os.path.join(folder, LOGS))
    >>> check_run_folder(folder)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: ... is not a keras-vit run (no config.json) but holds logs, which a run writes: pass another --out.
    """
    held = [name for name in RUN_ENTRIES if paths.exists(os.path.join(folder, name))]
    if not held:
        return
    config = os.path.join(folder, CONFIG)
    why = "no config.json"
    if paths.exists(config):
        try:
            TrainConfig.from_dict(json.loads(paths.read_text(config)), where=config)
            return
        except (ValueError, TypeError):
            why = "its config.json is not a run's"
    raise ValueError(
        f"{folder} is not a keras-vit run ({why}) but holds {', '.join(held)}, which a run "
        "writes: pass another --out."
    )


def clear(folder):
    """Deletes what a run wrote in `folder` (to start it over); other files stay.

    The backup goes first and `metrics.json` second, so a kill part-way leaves a
    folder that reads as new or as finished, never as a run to resume.
    """
    for name in (os.path.join(BACKUP, TrainingBackup.FILE), METRICS_JSON, MODEL, METRICS_CSV,
                 CONFIG, LABELS, SKIPPED_FILES, KEPT_WITH_WARNINGS):
        path = os.path.join(folder, name)
        if paths.exists(path):
            paths.remove(path)
    for name in (CHECKPOINTS, LOGS, BACKUP):
        path = os.path.join(folder, name)
        if paths.isdir(path):
            paths.rmtree(path)


def latest_checkpoint(run_dir):
    """The newest checkpoint of a run folder (`checkpoints/epoch_NNNN.keras`, or the
    sharded folder `epoch_NNNN.orbax`; `keras_vit.utils.model_files.read_keras` reads
    either), or None.

    Example:

    >>> latest_checkpoint("/tmp/no-such-run") is None
    True
    """
    found = EpochCheckpoints.find(os.path.join(run_dir, CHECKPOINTS))
    return found[-1] if found else None


def resolve_from(source):
    """The `keras_vit.weights.sources.Source` of a `--from` argument (a `Source` is
    returned as it is), a run folder's bound to the model to read.

    A run's output folder gives its final `model.keras`, or its newest checkpoint while
    it is unfinished (`Source.path`); every other source is `resolve_source`'s (a
    registry name, `hf:ORG/NAME`, `timm:NAME` or an `https://` URL is downloaded on
    first use of its `path`). A folder keras-vit writes that holds no model (the demo's,
    few-shot results) is refused naming what to pass.

    Example:

    >>> resolve_from("gs://vit_models/imagenet21k/ViT-B_16.npz").kind
    'npz'
    """
    if isinstance(source, Source):
        return source
    if not isinstance(source, str) or not source:
        raise ValueError(f"--from needs a path, got {source!r}.")
    if paths.isdir(source) and not paths.exists(os.path.join(source, CONFIG)):
        check_not_a_results_folder(source)
    described = resolve_source(source)
    if described.kind != "run":
        return described
    final = os.path.join(source, MODEL)
    if paths.exists(final):
        return described.at(final)
    checkpoint = latest_checkpoint(source)
    if checkpoint is None:
        raise FileNotFoundError(
            f"Run folder {source!r} has neither {MODEL} nor a checkpoint in {CHECKPOINTS}/ yet."
        )
    return described.at(checkpoint)


def check_not_a_results_folder(folder):
    """Raises `ValueError` naming what to pass instead when `folder` is one that
    keras-vit writes but that holds no model: the demo's folder (its runs are in
    sub-folders) or few-shot results.

    Example:

    >>> folder = tempfile.mkdtemp()
    >>> for stage in ("pretrain", "finetune"):
    ...     os.makedirs(os.path.join(folder, stage))
    ...     open(os.path.join(folder, stage, CONFIG), "w").close()
    >>> check_not_a_results_folder(folder)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: ... is a keras-vit demo folder: its models are in sub-folders; pass .../finetune (the fine-tuned model) or .../pretrain (the pretrained one).
    """
    stages = [
        name for name in DEMO_STAGES
        if paths.exists(os.path.join(folder, name, CONFIG))
    ]
    if stages:
        described = " or ".join(
            f"{os.path.join(folder, name)} ({DEMO_STAGES[name]})" for name in stages
        )
        raise ValueError(
            f"{folder} is a keras-vit demo folder: its models are in sub-folders; pass {described}."
        )
    if paths.exists(os.path.join(folder, FEWSHOT_RESULTS)):
        raise ValueError(
            f"{folder} holds few-shot results ({FEWSHOT_RESULTS}), not a model; pass the run "
            "folder or checkpoint that was evaluated."
        )


def run_config(source):
    """The `TrainConfig` of the run a `--from` argument belongs to, or None.

    Found beside the resolved file: a run folder's `config.json` serves its
    `model.keras` and its `checkpoints/`. The flat `config.json` of keras-vit 0.1 runs
    is read too (`TrainConfig.from_dict`).

    Example:

    >>> run_config("gs://vit_models/imagenet21k/ViT-B_16.npz") is None
    True
    """
    path = _run_file(source, CONFIG)
    if path is None:
        return None
    return TrainConfig.from_dict(json.loads(paths.read_text(path)), where=path)


def with_run_architecture(config, source):
    """`config` building the architecture of the keras-vit run `source` names (its variant,
    shape arguments, family switches and channels), or of the source
    `keras_vit.pretrained` builds (a registry name, an HF model folder: its
    `config.json`), as fine-tuning from a checkpoint does in timm and HF; the rest of
    `config` (resolution, regularisation, head) stays. Returns `(config, note)`: `note`
    says what changed, or is None (no such source, or the same architecture).

    Example:

    >>> source = "gs://vit_models/imagenet21k/ViT-B_16.npz"
    >>> with_run_architecture(TrainConfig(), source)[1] is None
    True
    """
    if not source:
        return config, None
    shape_keys = (*ARCHITECTURE, *FAMILY_DEFAULTS)
    described = resolve_from(source)
    run = run_config(described)
    if run is not None:
        variant, channels, theirs = run.model.variant, run.model.channels, run.model.kwargs
    else:
        theirs = described.arguments
        if theirs is None:
            return config, None
        variant, channels = theirs.get("variant") or "custom", theirs.get("channels", 3)
        # Fine-tuning drops CLIP's projection, as it drops pre_logits (`source_defaults`).
        shape_keys = tuple(k for k in shape_keys if k not in ("variant", "projection_dim"))
    theirs = {k: v for k, v in theirs.items() if k in shape_keys}
    kwargs = {k: v for k, v in config.model.kwargs.items() if k not in shape_keys}
    replaced = config.replace(
        model=dict(variant=variant, kwargs={**kwargs, **theirs}, channels=channels)
    )
    if replaced.model == config.model:
        return config, None
    described = ", ".join(f"{k}={v}" for k, v in theirs.items()) or variant
    return replaced, (
        f"Architecture of {source}: {variant} ({described}), {channels} "
        "channel(s), in place of the recipe's; --set model.kwargs... changes it."
    )


def class_names(source):
    """The class names of the run a `--from` argument belongs to (its `labels.txt`,
    one name per line in label order, written when its data named its classes), or None.

    Example:

    >>> class_names("gs://vit_models/imagenet21k/ViT-B_16.npz") is None
    True
    """
    path = _run_file(source, LABELS)
    return None if path is None else read_labels(path)


def read_labels(path):
    """Class names from a text file, one per line in class order (blank lines ignored);
    a file that is not UTF-8 text is a `ValueError` naming it."""
    payload = paths.read_bytes(path)
    try:
        text = payload.decode("utf-8-sig")
        if "\x00" in text:
            raise ValueError("it holds NUL bytes")
    except ValueError as error:  # UnicodeDecodeError too
        problem = (f"byte {error.start} is not UTF-8" if isinstance(error, UnicodeDecodeError)
                   else error)
        raise ValueError(
            f"Labels file {path!r} is not a text file ({problem}); pass class names, one per "
            "line in class order, as UTF-8 text."
        ) from None
    return [line.strip() for line in text.split("\n") if line.strip()]


def _run_file(source, name):
    """`name` in the run folder of the Keras model `source` resolves to (a run folder,
    the folder of its `model.keras`, or the one above `checkpoints/`; local or on a
    file system such as `gs://`), or None: other sources (weights files, HF and timm
    folders, registry names, downloads) belong to no run."""
    described = resolve_from(source)
    if not described.is_model or described.location.startswith(("http://", "https://")):
        return None
    path = described.path
    folder = os.path.dirname(path if paths.is_url(path) else os.path.abspath(path))
    for candidate in (folder, os.path.dirname(folder)):
        path = os.path.join(candidate, name)
        if paths.exists(path):
            return path
    return None


def output_activation(config):
    """The activation that turns a run's logits into probabilities: `sigmoid` for a run
    trained with the sigmoid loss, else (and without a run, `config=None`) `softmax`.

    Example:

    >>> output_activation(TrainConfig(optimization=dict(loss="sigmoid")))
    'sigmoid'
    """
    return "sigmoid" if config is not None and config.optimization.loss == "sigmoid" else "softmax"


def eval_crop_fraction(config, model=None):
    """The central crop of a run's evaluation, so that served images, figures and probes
    are seen as its evaluation saw them; without a run, that of the preprocessing
    `model`'s weights expect (`model_preprocessing`: None, the whole image resized, for
    the official ViT checkpoints), or None without a model either.

    Example:

    >>> eval_crop_fraction(None) is None, eval_crop_fraction(TrainConfig())
    (True, 0.875)
    """
    if config is not None:
        return config.evaluation.crop_fraction
    return None if model is None else model_preprocessing(model)["crop_fraction"]


def eval_source(config, spec=None, classes=None):
    """The labelled images to score a run's model on, as `(spec, source)`.

    `spec` if given (a `keras_vit.data.load_source` specification), else the run's
    `evaluation.source` or its `data.source`; `digits` without a run. Always the `test`
    split, restricted to `classes` (e.g. `"0-4"`, relabelled in order) if given, else,
    for the run's own source, to the classes (and label ids) the run was trained on.

    Example:

    >>> spec, source = eval_source(TrainConfig(data=dict(source="digits", classes="0-4")))
    >>> spec, source.num_classes
    ('digits', 5)
    >>> eval_source(None, "digits", classes="5-9")[1].num_classes
    5
    """
    if spec is None and config is not None:
        spec = config.evaluation.source or config.data.source
        classes = classes or config.data.classes
    source = vit_data.load_source(spec or "digits", "test")
    if classes:
        source = vit_data.select_classes(source, classes)
    return spec or "digits", source


def load_model(source):
    """Loads the Keras model a `--from` argument names: a run folder or a `.keras` file,
    or a source `keras_vit.pretrained` builds (a registry name, `timm:NAME`, an HF
    transformers model folder or `hf:ORG/NAME`).

    Example:

    >>> import tempfile, keras_vit
    >>> path = os.path.join(tempfile.mkdtemp(), "tiny.keras")
    >>> keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=1,
    ...               num_heads=4, mlp_dim=64, num_classes=10).save(path)
    >>> load_model(path).output_shape
    (None, 10)
    """
    described = resolve_from(source)
    if described.is_model:
        return _read_model(described)[1]
    if described.arguments is not None:
        return pretrained(described)
    raise ValueError(
        f"{described.given!r} holds weights only; build the model (keras_vit.ViT) and load "
        "them with keras_vit.load_pretrained, or pass a run folder, a .keras file, a "
        "registry name or an HF model folder."
    )


def _read_model(source):
    """`(source, model)`: the model of the resolved `source` (`resolve_from`), read
    whole, and `source` bound to the file read. Where that is the newest checkpoint
    of an unfinished run, a damaged one (`DamagedModel`: truncated, corrupt, or not
    finite) gives way to the newest earlier one that reads, with a warning; the error
    of the last one tried where none does."""
    candidates = [source.path]
    if source.kind == "run" and source.path == latest_checkpoint(source.location):
        candidates = EpochCheckpoints.find(os.path.join(source.location, CHECKPOINTS))[::-1]
    for index, candidate in enumerate(candidates):
        try:
            return source.at(candidate), read_keras(candidate)
        except DamagedModel as error:
            if index + 1 == len(candidates):
                raise
            logger.warning("%s Reading the checkpoint before it: %s.", error, candidates[index + 1])


def load_weights(model, source, *, interpolation=None):
    """Initialises `model` from a `--from` source, as fine-tuning does.

    A `.keras` model (or run folder) of the same architecture, resolution and classes is
    copied weight for weight. Any other case goes through `keras_vit.load_pretrained`
    (a `.keras` model in its official layout), which
    resamples the position embedding to the model's patch grid and resets the head when
    the class count differs; other mismatches raise `ValueError` listing them.

    Returns a short description of what was loaded.

    Example:

    >>> import tempfile, keras_vit
    >>> tiny = dict(patch_size=8, hidden_dim=32, num_layers=1, num_heads=4, mlp_dim=64)
    >>> path = os.path.join(tempfile.mkdtemp(), "tiny.keras")
    >>> keras_vit.ViT(image_size=32, num_classes=10, **tiny).save(path)
    >>> load_weights(keras_vit.ViT(image_size=32, num_classes=10, **tiny), path)  # doctest: +ELLIPSIS
    'copied 21 weights from ...tiny.keras'
    """
    described = resolve_from(source)
    if described.is_model:
        described, saved = _read_model(described)
        mine = {v.path: v for v in model.weights}
        theirs = {v.path: v for v in saved.weights}
        same = mine.keys() == theirs.keys() and all(
            tuple(mine[k].shape) == tuple(theirs[k].shape) for k in mine
        )
        if same:  # read_keras refused NaN or infinite weights
            for key, variable in mine.items():
                variable.assign(theirs[key].value)
            return f"copied {len(mine)} weights from {described.path}"
    try:
        report = load_pretrained(model, described, interpolation=interpolation)
    except NotFiniteWeights as error:  # its strict=False is no way to start a run
        raise _diverged(error.problem) from None
    return " ".join([f"loaded {described.given}:", *report.messages])


def _diverged(problem):
    return ValueError(f"{problem}: a run cannot start from it (a diverged run saves such "
                      "weights); pick an earlier checkpoint.")
