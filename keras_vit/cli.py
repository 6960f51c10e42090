"""The `keras-vit` command line.

Each subcommand is one function registered with `@command`; adding one is a
self-contained addition:

```python
def _arguments(parser):
    add_from_argument(parser, required=True)
    parser.add_argument("--data", default="digits")

@command("fewshot", "few-shot linear evaluation of a model", _arguments)
def fewshot(args):
    model = keras_vit.training.runs.load_model(args.source)
    ...
    return 0
```

`add_from_argument` (with `keras_vit.training.runs.resolve_from` / `load_model` /
`load_weights`), `add_data_argument`, `add_out_argument` and `load_recipe` are shared by
the subcommands; `--set key=value` is `keras_vit.training.config.apply_overrides`.

Command bodies hold argument handling only; what they run lives in the package. This
module imports nothing heavy at the top, so `--help` and argument errors are answered
before Keras and TensorFlow start (`start_backend` starts them for a command; the
log lines TensorFlow prints are dropped: `keras_vit.utils.tensorflow_log`).
"""

import argparse
import dataclasses
import importlib.util
import logging
import os
import shlex
import signal
import sys
from pathlib import Path

from keras_vit.utils import interrupts
from keras_vit.utils.tensorflow_log import tensorflow_log_dropped

COMMANDS = {}
CHECKS = {}
WITHOUT_BACKEND = set()


def command(name, help, arguments=None, check=None, backend=True):
    """Registers `function(args) -> exit code` as the subcommand `name`.

    `check(args)`, if given, runs before Keras and its backend start: it raises for what
    can be found wrong without them (a missing file, an extra not installed), so that a
    mistake is told at once rather than after the backend's import. `backend=False`: the
    command runs without Keras (`keras-vit weights`).

    Example:

    >>> @command("hello", "print a greeting")
    ... def hello(args):
    ...     print("hello")
    ...     return 0
    >>> main(["hello"])
    hello
    0
    """

    def register(function):
        COMMANDS[name] = (help, arguments, function)
        if check is not None:
            CHECKS[name] = check
        if not backend:
            WITHOUT_BACKEND.add(name)
        return function

    return register


# --- shared arguments ------------------------------------------------------------


def add_from_argument(parser, required=False):
    """`--from CKPT` (as `args.source`); resolve it with `keras_vit.training.runs`."""
    parser.add_argument(
        "--from",
        dest="source",
        required=required,
        metavar="CKPT",
        help="weights: a run's output folder, a .keras file, a registry name (keras-vit "
        "weights), hf:ORG/NAME, timm:NAME, or a checkpoint keras_vit.load_pretrained reads "
        "(.npz, .safetensors, HF folder, https:// or gs:// URL)",
    )


def add_data_argument(parser):
    """`--data SOURCE`, a `keras_vit.data.load_source` specification."""
    parser.add_argument(
        "--data",
        metavar="SOURCE",
        help="'digits' (built in), 'tfds:NAME[:SPLIT]' or a folder with one sub-folder per class",
    )


def add_out_argument(parser, required=False):
    """`--out DIR`."""
    parser.add_argument("--out", metavar="DIR", required=required, help="output folder")


# --- checks before the backend starts ----------------------------------------------


def check_from(source):
    """Raises, without Keras, what is wrong with a `--from` argument that its resolution
    (`keras_vit.weights.sources.resolve_source`) tells: a local path or name that does
    not exist, or `hf:` / `timm:` without huggingface_hub. URLs are left to be fetched,
    and folders that hold no model to `keras_vit.training.runs.resolve_from`, which
    names what to pass instead."""
    from keras_vit.utils.extras import check_installed
    from keras_vit.weights.sources import resolve_source

    if source is None or "://" in source:  # a look at a remote file system needs TensorFlow
        return
    try:
        described = resolve_source(source)
    except (FileNotFoundError, ValueError):
        if os.path.exists(source):
            return
        raise FileNotFoundError(
            f"--from {source!r} does not exist: pass a run's output folder, a .keras file, a "
            "checkpoint file, a registry name (keras-vit weights), hf:ORG/NAME or timm:NAME."
        ) from None
    if described.kind in ("hf", "timm"):
        check_installed("huggingface_hub", "Loading hf: or timm: weights")


def check_files(flag, paths):
    """Raises `FileNotFoundError` naming the first local file of `paths` (given with
    `flag`) that does not exist."""
    for path in paths:
        if path is not None and "://" not in path and not os.path.isfile(path):
            raise FileNotFoundError(f"No such file ({flag}): {path!r}.")


def _check_model_command(args):
    """`--from`, `--labels` and `--image` of the commands that load a model."""
    check_from(args.source)
    check_files("--labels", [getattr(args, "labels", None)])
    check_files("--image", getattr(args, "image", None) or [])


# --- recipes and overrides ---------------------------------------------------------


def shipped_recipes():
    """The folder of the recipes that come with keras-vit: `keras_vit/recipes` in an
    installed wheel (setup.py maps the repository's `recipes/` there), the repository's
    `recipes/` in a source checkout or an editable install."""
    package = Path(__file__).resolve().parent
    wheel = package / "recipes"
    return wheel if wheel.is_dir() else package.parent / "recipes"


def find_recipe(name, command=None):
    """The recipe file for `name`: a path to a `.py` file (`./recipes/x.py`, `x.py`), or
    `NAME.py` (or `COMMAND_NAME.py`) among `shipped_recipes()`.

    A bare name never reads the current folder: recipes are code, and running a command
    inside a folder someone else prepared must not execute their `recipes/NAME.py`.

    Example:

    >>> find_recipe("demo") == shipped_recipes() / "demo.py"
    True
    """
    if name.endswith(".py") or os.sep in name or "/" in name:
        path = Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"Recipe file {name!r} does not exist.")
        return path
    candidates = [f"{name}.py"] + ([f"{command}_{name}.py"] if command else [])
    folder = shipped_recipes()
    for candidate in candidates:
        if (folder / candidate).is_file():
            return folder / candidate
    available = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    raise FileNotFoundError(
        f"No recipe {name!r}: looked for {' or '.join(candidates)} in {folder} (a recipe of "
        f"your own: --recipe path/to/file.py); available: {', '.join(available) or 'none'}."
    )


def load_recipe(name, command=None, attribute="CONFIG"):
    """Loads a recipe file and returns its `CONFIG` (or another `attribute`).

    Example:

    >>> load_recipe("demo").model.variant
    'custom'
    >>> load_recipe("demo", attribute="DEMO").fewshot.classes
    '5-9'
    """
    path = find_recipe(name, command)
    spec = importlib.util.spec_from_file_location(f"keras_vit_recipe_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, attribute):
        raise ValueError(f"Recipe {str(path)!r} defines no {attribute}.")
    return getattr(module, attribute)


# --- training subcommands ----------------------------------------------------------


def _train_arguments(parser):
    parser.add_argument("--recipe", metavar="NAME", help="recipe name or .py file")
    add_data_argument(parser)
    add_out_argument(parser)
    add_from_argument(parser)
    parser.add_argument(
        "--strategy", help="tf.distribute strategy: auto, tpu, mirrored, multiworker or cpu"
    )
    parser.add_argument(
        "--strict-data", action="store_true", help="undecodable files are an error, not skipped"
    )
    parser.add_argument(
        "--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key (repeatable), e.g. --set schedule.epochs=3",
    )
    parser.add_argument(
        "--restart", action="store_true",
        help="start over: delete what an earlier run wrote in --out (an unfinished run "
        "resumes, a finished one is left as it is, without it)",
    )


def _check_recipe_command(args, command_name):
    """`--recipe` (or the command's default), `--from` and the backend of a command that
    runs a recipe."""
    find_recipe(args.recipe or command_name, command_name)
    check_from(args.source)
    _check_trains_here(command_name)


def _check_trains_here(command_name):
    from keras_vit.training.config import check_training_backend
    from keras_vit.utils.allocator import keras_backend

    check_training_backend(keras_backend(), f"keras-vit {command_name}")


def _configure(args, command_name, default_recipe):
    from keras_vit.training.config import apply_overrides
    from keras_vit.training.runs import with_run_architecture

    recipe = args.recipe or default_recipe
    config = load_recipe(recipe, command_name)
    config, note = with_run_architecture(config, args.source)
    if note:
        logging.getLogger("keras_vit").info(note)
    flags = dict(
        data=dict(source=args.data, strict=args.strict_data or None),
        model=dict(init_from=args.source),
        distribution=dict(strategy=args.strategy),
    )
    config = config.replace(
        **{name: {k: v for k, v in keys.items() if v is not None} for name, keys in flags.items()}
    )
    if args.out is not None:
        config = config.replace(out=args.out)
    return apply_overrides(config, args.assignments).validate()


def _train(config, restart=False):
    from keras_vit.training.engine import train

    result = train(config, restart=restart)
    summary = ", ".join(f"{k} {v:.4f}" for k, v in result.metrics.items())
    print(f"Evaluation: {summary or 'no evaluation data'}")
    print(f"Model: {os.path.join(result.out, 'model.keras')}")
    return 0


@command("pretrain", "train a ViT from scratch (recipe 'pretrain' by default)", _train_arguments,
         lambda args: _check_recipe_command(args, "pretrain"))
def pretrain(args):
    return _train(_configure(args, "pretrain", "pretrain"), args.restart)


@command(
    "finetune",
    "fine-tune pretrained weights (recipe 'finetune' by default; needs --from)",
    _train_arguments,
    lambda args: _check_recipe_command(args, "finetune"),
)
def finetune(args):
    config = _configure(args, "finetune", "finetune")
    if not config.model.init_from:
        raise ValueError(
            "finetune needs weights: pass --from CKPT (or --set model.init_from=...)."
        )
    return _train(config, args.restart)


# --- few-shot evaluation and the demo ----------------------------------------------


def parse_int_list(flag, text):
    """`"1,5,10"` -> `(1, 5, 10)`; anything but positive integers is a ValueError naming `flag`.

    Example:

    >>> parse_int_list("--shots", "1,5,10,25")
    (1, 5, 10, 25)
    """
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ValueError(
            f"{flag} expects comma-separated positive integers (e.g. 1,5,10,25), got {text!r}."
        )
    return tuple(int(part) for part in parts)


def _fewshot_arguments(parser):
    parser.add_argument("--recipe", metavar="NAME", help="recipe name or .py file (default: fewshot)")
    add_from_argument(parser, required=True)
    add_data_argument(parser)
    parser.add_argument("--shots", metavar="N,N,...", help="shots per class, e.g. 1,5,10,25")
    parser.add_argument("--seeds", metavar="N", help="number of seeds (samples per shot count)")
    parser.add_argument("--classes", metavar="SPEC", help="use only these classes, e.g. 5-9")
    parser.add_argument("--l2", metavar="L2", help="ridge strength (e.g. 1024), or 'sweep'")
    add_out_argument(parser)
    parser.add_argument(
        "--overwrite", action="store_true", help="replace results already in --out"
    )
    parser.add_argument(
        "--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key (repeatable), e.g. --set data.batch_size=64",
    )


@command("fewshot", "few-shot linear evaluation of a model's representation", _fewshot_arguments,
         lambda args: _check_recipe_command(args, "fewshot"))
def fewshot(args):
    from keras_vit.evaluation import fewshot as vit_fewshot
    from keras_vit.training.config import apply_overrides
    from keras_vit.training.runs import FEWSHOT_RESULTS, load_model

    config = load_recipe(args.recipe or "fewshot", "fewshot")
    flags = dict(data=args.data, out=args.out, classes=args.classes)
    if args.shots is not None:
        flags["shots"] = parse_int_list("--shots", args.shots)
    if args.seeds is not None:
        flags["seeds"] = parse_int_list("--seeds", args.seeds)
        if len(flags["seeds"]) != 1:
            raise ValueError(f"--seeds expects one positive integer, got {args.seeds!r}.")
        flags["seeds"] = flags["seeds"][0]
    if args.l2 == "sweep":
        flags["sweep"] = True
    elif args.l2 is not None:
        try:
            flags.update(l2=float(args.l2), sweep=False)
        except ValueError:
            raise ValueError(f"--l2 expects a positive number or 'sweep', got {args.l2!r}.") from None
    config = dataclasses.replace(config, **{k: v for k, v in flags.items() if v is not None})
    config = apply_overrides(config, args.assignments).validate()
    previous = os.path.join(config.out, FEWSHOT_RESULTS)
    if os.path.exists(previous) and not args.overwrite:
        raise ValueError(
            f"{config.out} already holds few-shot results ({previous}); pass another --out, "
            "or --overwrite to replace them."
        )
    model = load_model(args.source)
    result = vit_fewshot.evaluate_source(model, config, verbose="auto")
    table = vit_fewshot.save_results({os.path.basename(os.path.normpath(args.source)): result}, config.out)
    print(table)
    print(f"Results: {os.path.join(config.out, 'fewshot.json')}, fewshot.png")
    return 0


def _demo_arguments(parser):
    parser.add_argument("--recipe", metavar="NAME", help="recipe with a DEMO config (default: demo)")
    add_out_argument(parser)


@command(
    "demo",
    "pretrain on digits 0-4, few-shot evaluate and fine-tune on 5-9 (a few minutes, no network)",
    _demo_arguments,
    lambda args: (find_recipe(args.recipe or "demo", "demo"), _check_trains_here("demo")),
)
def demo(args):
    from keras_vit.demo import run_demo

    config = load_recipe(args.recipe or "demo", "demo", attribute="DEMO")
    out = args.out or config.out
    summary = run_demo(config, out=out)
    minutes = sum(summary["seconds"].values()) / 60
    print(summary["table"])
    print(f"{minutes:.1f} minutes. Tables, plots and runs: {out}/ (table.txt, fewshot.png, "
          "training.png, pretrain/, finetune/; digit.png, a test digit to try visualize on)")
    return 0


def _load_run_model(source):
    """The model `--from` names and the `TrainConfig` of the run it came from (or None)."""
    from keras_vit.training import runs

    described = runs.resolve_from(source)
    return runs.load_model(described), runs.run_config(described)


def _labels(args):
    """Class names: `--labels FILE`, else those the `--from` run stored, else None."""
    source = getattr(args, "source", None)
    if not (args.labels or source):
        return None
    from keras_vit.training import runs

    if args.labels:
        return runs.read_labels(args.labels)
    return runs.class_names(source)


def _crop_fraction(args, config, model):
    from keras_vit.training.runs import eval_crop_fraction

    if args.crop_fraction is not None:
        return args.crop_fraction
    return eval_crop_fraction(config, model)


def _add_crop_argument(parser):
    parser.add_argument(
        "--crop-fraction", type=float, metavar="F",
        help="central crop of the eval preprocessing (default: the run's "
        "evaluation.crop_fraction, else the checkpoint's: none, the whole image resized, "
        "for the official ViT files)",
    )


def _export_arguments(parser):
    add_from_argument(parser, required=True)
    add_out_argument(parser, required=True)
    parser.add_argument(
        "--labels", metavar="FILE",
        help="class names, one per line, in class order (default: the run's labels.txt)",
    )
    parser.add_argument(
        "--top-k", type=int, default=5, metavar="K", help="classes returned (default 5)"
    )
    parser.add_argument(
        "--activation", choices=("softmax", "sigmoid"),
        help="default: sigmoid for a run trained with the sigmoid loss, else softmax",
    )
    _add_crop_argument(parser)
    parser.add_argument(
        "--format", choices=("saved_model", "onnx", "tflite"), default="saved_model",
        help="saved_model (default; --out is a folder), onnx or tflite (--out is the file; "
        "these take float pixels in [-1, 1] at the model's size and return logits)",
    )
    parser.add_argument(
        "--native-resolution", action="store_true",
        help="saved_model only: serve each image at its own size, not resized (a model "
        "built with dynamic_image_size=True; sides multiples of the patch size unless it pads)",
    )
    parser.add_argument(
        "--quantize", choices=("dynamic-int8",),
        help="tflite only: int8 weights (the converter's dynamic-range quantization)",
    )
    parser.add_argument(
        "--overwrite", action="store_true",
        help="replace --out even if it is not an earlier keras-vit export (its files are "
        "lost; never the folder exported from)",
    )


def _export_file(args, model, labels, metadata, crop_fraction):
    """`--format onnx` or `tflite`: writes the file, runs it in its own runtime against
    Keras, and prints what the client must feed it."""
    if args.format == "onnx":
        from keras_vit.export.onnx import check_onnx, export_onnx

        record = export_onnx(
            model, args.out, crop_fraction=crop_fraction, labels=labels, metadata=metadata,
            overwrite=args.overwrite,
        )
        difference, runtime = check_onnx(model, args.out), "onnxruntime"
    else:
        from keras_vit.export.tflite import check_tflite, export_tflite

        record = export_tflite(
            model, args.out, quantize=args.quantize, crop_fraction=crop_fraction,
            labels=labels, metadata=metadata, overwrite=args.overwrite,
        )
        difference = check_tflite(model, args.out, quantized=args.quantize is not None)
        runtime = "the LiteRT interpreter"
    print(f"{args.format.upper()} ({os.path.getsize(args.out)} bytes"
          f"{', ' + args.quantize if args.quantize else ''}): {args.out}")
    naflex = record.get("naflex")
    if naflex:
        inputs = ", ".join(f"{name} {spec['dtype']} {spec['shape']}"
                           for name, spec in naflex["inputs"].items())
        print(f"Inputs {inputs}: {record['preprocessing']}.")
        budget = naflex["max_num_patches"]
        checked = (f"3 random images of mixed aspect ratios at {budget} and "
                   f"{max(1, budget // 2)} tokens")
    else:
        print(f"Input {record['input']['name']} float32 {record['input']['shape']}: "
              f"{record['preprocessing']}.")
        checked = "3 random images"
    print(f"Checked with {runtime} against Keras on {checked}: max |difference| "
          f"{difference:.2g}.")


def _check_export(args):
    from keras_vit.utils.allocator import keras_backend
    from keras_vit.utils.extras import ONNX_EXPORTERS, check_installed

    _check_model_command(args)
    if args.format == "onnx":
        check_installed("onnx", "ONNX export")
        if keras_backend() in ONNX_EXPORTERS:
            check_installed(ONNX_EXPORTERS[keras_backend()], "ONNX export")
        check_installed("onnxruntime", "Checking an ONNX file")


@command(
    "export",
    "export for serving: a SavedModel (images in, probabilities and top-k out), ONNX or TFLite",
    _export_arguments,
    _check_export,
)
def export(args):
    from keras_vit.export.records import check_export_target
    from keras_vit.export.saved_model import export_saved_model
    from keras_vit.models.naflex_mode import is_naflex
    from keras_vit.training.runs import output_activation, resolve_from

    if args.quantize and args.format != "tflite":
        print(f"--quantize {args.quantize} applies to --format tflite only; for an int8 "
              "Keras model, use model.quantize('int8') (see docs/export.md).", file=sys.stderr)
        return 2
    if args.native_resolution and args.format != "saved_model":
        print(f"--native-resolution applies to --format saved_model only; {args.format} "
              "files take images at the model's size.", file=sys.stderr)
        return 2
    # Before the model loads: a refusal comes at once.
    check_export_target(args.out, args.format, source=args.source, overwrite=args.overwrite)
    model, config = _load_run_model(args.source)
    labels = _labels(args)
    activation = args.activation or output_activation(config)
    metadata = dict(
        source=args.source, file=resolve_from(args.source).path,
        train_config=config and config.to_dict(),
    )
    # Served at its own size (or as NaFlex patches), an image is not cropped unless
    # --crop-fraction asks (an error).
    native = args.native_resolution or is_naflex(model)
    crop_fraction = args.crop_fraction if native else _crop_fraction(args, config, model)
    if args.format != "saved_model":
        _export_file(args, model, labels, metadata, crop_fraction)
        return 0
    record = export_saved_model(
        model, args.out, labels=labels, top_k=args.top_k, activation=activation,
        crop_fraction=crop_fraction, native_resolution=args.native_resolution, metadata=metadata,
        overwrite=args.overwrite,
    )
    crop = "whole image" if crop_fraction is None else f"central crop {crop_fraction}"
    if args.native_resolution:
        crop = "each image at its own size"
    if "naflex" in record:
        crop = (f"NaFlex: {record['naflex']['patch_size']}-pixel patches, any token count, "
                f"budget {record['naflex']['max_num_patches']}")
    print(f"SavedModel ({activation}, top {record['top_k']}, {crop}): {args.out}")
    if "naflex" in record:
        print(f"Inputs: {record['naflex']['make_inputs']}.")
    return 0


def _visualize_arguments(parser):
    add_from_argument(parser, required=True)
    parser.add_argument("--image", required=True, nargs="+", metavar="IMG", help="image files")
    add_out_argument(parser, required=True)
    parser.add_argument("--head-fusion", choices=("mean", "max", "min"), default="mean")
    _add_crop_argument(parser)


@command(
    "visualize",
    "draw attention maps and rollout, attention distance, position similarity and filters",
    _visualize_arguments,
    _check_model_command,
)
def visualize(args):
    from keras_vit import figures
    from keras_vit import data
    from keras_vit.models.preprocessing import model_preprocessing
    from keras_vit.models.vit import default_image_size

    model, config = _load_run_model(args.source)
    images = data.read_images(
        args.image, default_image_size(model), channels=model.input_shape[-1],
        crop_fraction=_crop_fraction(args, config, model),
        preprocessing=model_preprocessing(model),
    )
    for name, path in sorted(figures.visualize(model, images, args.out, args.head_fusion).items()):
        print(f"{name}: {path}")
    return 0


def _probe_arguments(parser):
    add_from_argument(parser, required=True)
    add_data_argument(parser)
    parser.add_argument("--classes", metavar="SPEC",
                        help="use only these classes, e.g. 0-4 (default: the run's own)")
    add_out_argument(parser, required=True)
    parser.add_argument("--drop", metavar="F,F,...", default="0,0.1,0.25,0.5,0.75,0.9",
                        help="fractions of patches occluded")
    parser.add_argument("--grids", metavar="N,N,...", default="2,4,8",
                        help="cells per side of the shuffled grids")
    parser.add_argument("--batch-size", type=int, default=128)
    _add_crop_argument(parser)


def _parse_fractions(flag, text):
    error = ValueError(f"{flag} expects comma-separated fractions in [0, 1], got {text!r}.")
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise error from None
    if not all(0 <= v <= 1 for v in values):
        raise error
    return values


@command(
    "probe", "robustness curves: accuracy as patches are occluded and shuffled", _probe_arguments,
    _check_model_command,
)
def probe(args):
    from keras_vit import data
    from keras_vit.evaluation import probes
    from keras_vit.models.preprocessing import model_preprocessing
    from keras_vit.models.vit import default_image_size
    from keras_vit.training.runs import eval_source

    drop = _parse_fractions("--drop", args.drop)
    grids = parse_int_list("--grids", args.grids)
    model, config = _load_run_model(args.source)
    spec, source = eval_source(config, args.data, args.classes)
    dataset = data.eval_dataset(
        source, default_image_size(model), args.batch_size, channels=model.input_shape[-1],
        crop_fraction=_crop_fraction(args, config, model),
        preprocessing=model_preprocessing(model),
    )
    results = probes.robustness_probes(model, dataset, drop_fractions=drop, shuffle_grids=grids)
    numbers, plot = probes.save_results(results, args.out, data=spec)
    print(f"{spec}, {source.num_classes} classes: {results['examples']} images, "
          f"clean accuracy {results['accuracy']:.4f}")
    for fraction, accuracy in results["occlusion"].items():
        print(f"  {fraction:4.0%} of patches dropped: {accuracy:.4f}")
    for grid, accuracy in results["shuffle"].items():
        print(f"  shuffled {grid}x{grid}: {accuracy:.4f}")
    print(f"Figure: {plot}; numbers: {numbers}")
    return 0


# --- pretrained weights: the registry and classifying images -----------------------


def _weights_arguments(parser):
    parser.add_argument(
        "pattern", nargs="?", metavar="PATTERN",
        help="part of a name, or a shell pattern such as 'vit_base_*in1k'",
    )
    parser.add_argument(
        "--verify", action="store_true",
        help="re-hash every cached file against the SHA-256 pinned at its first download "
        "(exit 1 if one changed)",
    )


@command("weights", "list the registry of pretrained checkpoints (and which are cached)",
         _weights_arguments, backend=False)
def weights(args):
    if args.verify:
        if args.pattern:
            raise ValueError("--verify checks the whole cache: leave out PATTERN.")
        from keras_vit.weights.cache import verify_cache

        lines, changed = verify_cache()
        print("\n".join(lines))
        return 1 if changed else 0
    from keras_vit.weights import download, registry

    entries = registry.list_weights(args.pattern)
    if not entries:
        raise ValueError(f"No registered weights match {args.pattern!r}; keras-vit weights lists all.")
    rows = [("name", "variant", "res", "classes", "data", "top-1", "size", "cached")]
    for e in entries:
        data = e.pretraining + (f" > {e.finetuning}" if e.finetuning else "")
        rows.append((
            e.name, e.variant or "custom", str(e.image_size), str(e.num_classes), data,
            "-" if e.top1 is None else f"{e.top1:.2f}",
            "-" if e.size_mib is None else f"{e.size_mib:.0f} MiB",
            "yes" if download.cached(e) else "no",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print(f"Cache: {download.cache_dir()} (KERAS_VIT_CACHE); top-1: ImageNet-1k, as the "
          "release reports it.")
    return 0


def _predict_arguments(parser):
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", metavar="NAME", help="a registry name (keras-vit weights)")
    source.add_argument(
        "--from", dest="source", metavar="CKPT",
        help="a run's output folder, a .keras file, or an HF model folder or hf:ORG/NAME",
    )
    parser.add_argument(
        "images", nargs="+", metavar="IMAGE",
        help="image files, folders (every image below) or quoted glob patterns ('photos/**/*.jpg')",
    )
    parser.add_argument("--top-k", type=int, default=5, metavar="K", help="classes shown (default 5)")
    parser.add_argument(
        "--batch-size", type=int, default=32, metavar="N", help="images per batch (default 32)"
    )
    parser.add_argument(
        "--precision", choices=("float32", "bfloat16", "auto"), default=None,
        help="compute in float32 or bfloat16 (float32 weights and logits), or auto: bfloat16 "
        "on a CPU with bfloat16 products (avx512_bf16, amx_bf16), else float32 (default: "
        "the model's own)",
    )
    parser.add_argument(
        "--labels", metavar="FILE",
        help="class names, one per line, in class order (default: the run's labels.txt)",
    )
    parser.add_argument(
        "--naflex", action="store_true",
        help="run a model that is not a NaFlex one as its NaFlex twin (the same weights): "
        "each image at its own aspect ratio, within the token budget (NaFlex models always are)",
    )
    parser.add_argument(
        "--max-num-patches", type=int, metavar="N",
        help="NaFlex token budget per image (default: the model's, the patches of its "
        "position table's grid)",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print JSON")
    output.add_argument(
        "--csv", action="store_true", help="print CSV: image, rank, class, label, probability"
    )
    _add_crop_argument(parser)


def _check_predict(args):
    from keras_vit.utils.image_files import image_paths
    from keras_vit.weights import registry
    from keras_vit.weights.sources import DESCRIBED, resolve_source

    weights = args.weights
    # pretrained() builds what describes its architecture: registry names, hf: / timm:
    # sources, HF and timm model folders; for anything else (and an unknown name) the
    # registry says what names it may mean.
    if weights and resolve_source(weights).kind not in DESCRIBED:
        registry.get_weights(weights)
    check_from(weights)
    _check_model_command(args)
    if args.max_num_patches is not None and args.max_num_patches < 1:
        raise ValueError(
            f"--max-num-patches must be 1 or more, got {args.max_num_patches}: pass the "
            "tokens each image may take (SigLIP 2's default: 256)."
        )
    paths = image_paths(args.images)
    if all("://" not in path and not os.path.exists(path) for path in paths):
        raise FileNotFoundError(f"No such image file: {paths[0]!r}; nothing to classify.")


@command("predict", "classify images with a pretrained checkpoint or a trained model",
         _predict_arguments, _check_predict)
def predict(args):
    import json

    from keras_vit.inference import classify
    from keras_vit.models.naflex_mode import is_naflex
    from keras_vit.utils.csv_rows import write_rows
    from keras_vit.weights.pretrained import NotFiniteWeights, pretrained

    labels = _labels(args)
    if args.weights:
        try:
            model, config = pretrained(args.weights), None
        except NotFiniteWeights as error:  # its strict=False has no flag here
            raise ValueError(
                f"{error.problem}: the model would not give finite outputs, and keras-vit "
                "predict does not load it; delete the file to download it again."
            ) from None
        activation = None  # classify's: the checkpoint's
        crop_fraction = "model" if args.crop_fraction is None else args.crop_fraction
    else:  # a run folder or a .keras file (`--from`)
        from keras_vit.training.runs import output_activation

        model, config = _load_run_model(args.source)
        activation = output_activation(config) if config is not None else None
        crop_fraction = _crop_fraction(args, config, model)
    if args.naflex or is_naflex(model):  # no crop: classify refuses a --crop-fraction
        crop_fraction = "model" if args.crop_fraction is None else args.crop_fraction
    results = classify(
        model, args.images, top_k=args.top_k, labels=labels, activation=activation,
        crop_fraction=crop_fraction, batch_size=args.batch_size, skip_unreadable=True,
        progress=_progress_line if sys.stderr.isatty() else None,
        naflex=args.naflex or None, max_num_patches=args.max_num_patches,
        precision=args.precision,
    )
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if not results:
        raise ValueError("No image could be read (see the lines above); nothing to classify.")
    if args.json:
        print(json.dumps(results, indent=2))
    elif args.csv:
        write_rows(sys.stdout, [["image", "rank", "class", "label", "probability"]] + [
            [result["image"], rank, top["class"], top["label"], f"{top['probability']:.6f}"]
            for result in results
            for rank, top in enumerate(result["top_k"], 1)
        ])
    else:
        for result in results:
            print(result["image"])
            for top in result["top_k"]:
                print(f"  {top['probability']:.4f}  {top['label']}")
    return 0


def _progress_line(done, total):
    print(f"\rClassified {done}/{total} images", end="", file=sys.stderr, flush=True)


# --- entry point -------------------------------------------------------------------


def build_parser():
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="keras-vit", description="Train and use Vision Transformers (keras-vit)."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help, arguments, _) in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=help, description=help)
        if arguments:
            arguments(subparser)
    return parser


def start_backend():
    """Imports Keras and its backend, as every command but a few needs them, with freed
    memory kept for reuse where that backend gains from it (the command opts in to
    `keras_vit.utils.allocator.configure_for_backend`; a library import does not)."""
    from keras_vit.utils.allocator import configure_for_backend

    configure_for_backend()
    import keras  # noqa: F401


class _StderrHandler(logging.StreamHandler):
    """Logs to whatever `sys.stderr` is when a record comes (tests and notebooks swap it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def main(argv=None):
    """Runs the `keras-vit` command; returns its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    logger = logging.getLogger("keras_vit")
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("keras-vit: %(message)s"))
        logger.addHandler(handler)
    # Set on every command: a level a caller set and restored (pytest's caplog) can leave
    # NOTSET behind, and the root's WARNING would then silence the command's notes.
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    # SIGTERM (a scheduler, `kill`) stops a command as Ctrl-C does, with the same line.
    with interrupts.catching_signals(), tensorflow_log_dropped():
        return _run_command(args, argv)


def _run_command(args, argv):
    """Runs `args.command`; returns its exit code, and says in one line why it failed."""
    try:
        backend = os.environ.get("KERAS_BACKEND")
        if backend in ("jax", "torch"):  # Keras would fail on import with a bare ImportError.
            from keras_vit.utils.extras import check_installed

            check_installed(backend, f"KERAS_BACKEND={backend}")
        if args.command in CHECKS:
            CHECKS[args.command](args)
        if args.command not in WITHOUT_BACKEND:
            start_backend()
        return COMMANDS[args.command][2](args)
    except KeyboardInterrupt as error:
        if os.environ.get("KERAS_VIT_DEBUG", "0") not in ("", "0"):
            raise
        signum = interrupts.received[0] if interrupts.received else signal.SIGINT
        name = signal.Signals(signum).name
        where = str(error) or "Interrupted."
        if str(error):  # a run (keras_vit.training.engine.TrainingInterrupted)
            words = sys.argv[1:] if argv is None else argv
            where += f" Resume it with: keras-vit {shlex.join(words)}"
        print(f"keras-vit {args.command}: {name}: {where}", file=sys.stderr)
        return 128 + signum
    except Exception as error:  # One line, never a traceback, unless asked for one.
        if os.environ.get("KERAS_VIT_DEBUG", "0") not in ("", "0"):
            raise
        print(f"keras-vit {args.command}: error: {describe_error(error)}", file=sys.stderr)
        # 1: a run failed under way (a NaN loss, keras_vit.training.engine.TrainingFailed);
        # 2: anything else, bad input.
        return getattr(error, "exit_code", 1 if isinstance(error, FloatingPointError) else 2)


def describe_error(error):
    """One line for `error`: its message, and what to do where the message does not say.

    Example:

    >>> describe_error(PermissionError(13, "Permission denied", "/runs/x"))
    "Permission denied: '/runs/x' (check the path: a folder written to must be writable, with free space; a file read must exist)."
    """
    message = " ".join(str(getattr(error, "message", None) or error).split())
    hint = "check the path: a folder written to must be writable, with free space; a file read must exist"
    file_system = type(error).__module__.startswith("tensorflow")  # tf.io.gfile's errors
    if isinstance(error, OSError) and not isinstance(error, FileNotFoundError) and error.strerror:
        where = f": {error.filename!r}" if error.filename else ""
        return f"{error.strerror}{where} ({hint})."
    if file_system and ("://" in message or "HTTP" in message):
        return f"{message} (check the URL and the network connection)."
    if file_system:
        return f"{message} ({hint})."
    if isinstance(error, (ValueError, OSError, FloatingPointError)) or "keras_vit" in type(error).__module__:
        return message or type(error).__name__
    return (
        f"{type(error).__name__}: {message} (unexpected: KERAS_VIT_DEBUG=1 shows the "
        "traceback for a bug report)."
    )
