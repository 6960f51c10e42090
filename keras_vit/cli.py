"""The `keras-vit` command line.

Each subcommand is one function registered with `@command`; adding one is a
self-contained addition:

```python
def _arguments(parser):
    add_from_argument(parser, required=True)
    parser.add_argument("--data", default="digits")

@command("fewshot", "few-shot linear evaluation of a model", _arguments)
def fewshot(args):
    model = keras_vit.runs.load_model(args.source)
    ...
    return 0
```

`add_from_argument` (with `keras_vit.runs.resolve_from` / `load_model` /
`load_weights`), `add_data_argument`, `add_out_argument`, `load_recipe` and
`apply_overrides` are shared by the subcommands.
"""

import argparse
import ast
import dataclasses
import importlib.util
import logging
import os
import sys
import typing
from pathlib import Path

COMMANDS = {}


def command(name, help, arguments=None):
    """Registers `function(args) -> exit code` as the subcommand `name`.

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
        return function

    return register


# --- shared arguments ------------------------------------------------------------


def add_from_argument(parser, required=False):
    """`--from CKPT` (as `args.source`); resolve it with `keras_vit.runs`."""
    parser.add_argument(
        "--from",
        dest="source",
        required=required,
        metavar="CKPT",
        help="weights: a run's output folder, a .keras file, or a checkpoint "
        "keras_vit.load_pretrained reads (.npz, .safetensors, HF folder, gs:// URL)",
    )


def add_data_argument(parser):
    """`--data SOURCE`, a `keras_vit.data.load_source` specification."""
    parser.add_argument(
        "--data",
        metavar="SOURCE",
        help="'digits' (built in), 'tfds:NAME[:SPLIT]' or a folder with one sub-folder per class",
    )


def add_out_argument(parser):
    """`--out DIR`."""
    parser.add_argument("--out", metavar="DIR", help="output folder")


# --- recipes and overrides ---------------------------------------------------------


def recipe_folders():
    """Where `--recipe NAME` looks: `./recipes`, then the `recipes/` folder beside the
    package (a source checkout or an editable install)."""
    here = Path(__file__).resolve().parent.parent / "recipes"
    folders = [Path.cwd() / "recipes", here]
    return list(dict.fromkeys(f for f in folders if f.is_dir()))


def find_recipe(name, command=None):
    """The recipe file for `name`: a path to a `.py` file, or `NAME.py` (or
    `COMMAND_NAME.py`) in one of `recipe_folders()`.

    Example:

    >>> find_recipe("demo").name
    'demo.py'
    """
    if name.endswith(".py") or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"Recipe file {name!r} does not exist.")
        return path
    candidates = [f"{name}.py"] + ([f"{command}_{name}.py"] if command else [])
    for folder in recipe_folders():
        for candidate in candidates:
            if (folder / candidate).is_file():
                return folder / candidate
    available = sorted(
        {p.stem for folder in recipe_folders() for p in folder.glob("*.py") if p.stem != "__init__"}
    )
    raise FileNotFoundError(
        f"No recipe {name!r}: looked for {' or '.join(candidates)} in "
        f"{', '.join(map(str, recipe_folders())) or 'no recipes folder'}; "
        f"available: {', '.join(available) or 'none'}."
    )


def load_recipe(name, command=None):
    """Loads a recipe file and returns its `CONFIG`.

    Example:

    >>> load_recipe("demo").model
    'custom'
    """
    path = find_recipe(name, command)
    spec = importlib.util.spec_from_file_location(f"keras_vit_recipe_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "CONFIG"):
        raise ValueError(f"Recipe {str(path)!r} defines no CONFIG.")
    return module.CONFIG


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _parse(key, text, kind):
    """`text` converted to the type `kind` of config field `key`, or ValueError."""
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


def apply_overrides(config, assignments):
    """Returns `config` (a dataclass) with `key=value` assignments applied.

    Values are parsed by the field's type (`none` for optional fields; tuples, lists and
    dicts as Python literals); `key.sub=value` sets one entry of a dict field.

    Example:

    >>> from keras_vit.training import TrainConfig
    >>> config = apply_overrides(TrainConfig(), ["epochs=3", "crop_area=(0.5, 1.0)",
    ...                                          "model_kwargs.dropout_rate=0.1"])
    >>> config.epochs, config.crop_area, config.model_kwargs
    (3, (0.5, 1.0), {'dropout_rate': 0.1})
    """
    hints = typing.get_type_hints(type(config))
    changes = {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        key = key.strip()
        field, _, entry = key.partition(".")
        if not sep:
            raise ValueError(f"--set expects key=value, got {assignment!r}.")
        if field not in hints:
            raise ValueError(
                f"Unknown config key {field!r} in --set {assignment}; valid keys: "
                f"{', '.join(sorted(hints))}."
            )
        if entry:
            if hints[field] is not dict:
                raise ValueError(f"--set {assignment}: {field} is not a dict field.")
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text
            changes[field] = {**changes.get(field, getattr(config, field)), entry: value}
        else:
            changes[field] = _parse(field, text, hints[field])
    return dataclasses.replace(config, **changes)


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
        help="override a config field (repeatable), e.g. --set epochs=3",
    )


def _configure(args, command_name, default_recipe):
    recipe = args.recipe or default_recipe
    config = load_recipe(recipe, command_name)
    flags = dict(
        data=args.data,
        out=args.out,
        init_from=args.source,
        strategy=args.strategy,
        strict_data=args.strict_data or None,
    )
    config = dataclasses.replace(config, **{k: v for k, v in flags.items() if v is not None})
    return apply_overrides(config, args.assignments).validate()


def _train(config):
    from keras_vit.training import train

    result = train(config)
    summary = ", ".join(f"{k} {v:.4f}" for k, v in result.metrics.items())
    print(f"Evaluation: {summary or 'no evaluation data'}")
    print(f"Model: {os.path.join(result.out, 'model.keras')}")
    return 0


@command("pretrain", "train a ViT from scratch (recipe 'pretrain' by default)", _train_arguments)
def pretrain(args):
    return _train(_configure(args, "pretrain", "pretrain"))


@command(
    "finetune",
    "fine-tune pretrained weights (recipe 'finetune' by default; needs --from)",
    _train_arguments,
)
def finetune(args):
    config = _configure(args, "finetune", "finetune")
    if not config.init_from:
        raise ValueError("finetune needs weights: pass --from CKPT (or --set init_from=...).")
    return _train(config)


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
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("keras-vit: %(message)s"))
    logger = logging.getLogger("keras_vit")
    if not logger.handlers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        return COMMANDS[args.command][2](args)
    except (ValueError, FileNotFoundError) as error:
        print(f"keras-vit {args.command}: error: {error}", file=sys.stderr)
        return 2
    except FloatingPointError as error:
        print(f"keras-vit {args.command}: {error}", file=sys.stderr)
        return 1
