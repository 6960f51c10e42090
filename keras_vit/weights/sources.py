"""Resolving a weights source: `resolve_source` turns what a user names (`weights=`,
`--from`, `--weights`, `keras_vit.pretrained`) into one `Source` that every reader takes.

A source is a registry name, `timm:NAME`, `hf:ORG/NAME`, an `http(s)://` URL, a local
path or a `gs://` URL: an `.npz` file, a `.safetensors` file (or a folder of shards),
an HF transformers or timm model folder, a `.keras` file, a sharded `.orbax`
checkpoint, or a keras-vit run folder. It is classified once, by its name and a look at
the file system (no download, no Keras); its files are fetched on first use
(`Source.path`), and what it implies (`arguments`, `preprocessing`, `entry`) is read
from the registry or its own files.

A run folder is recognised here by its files (a keras-vit run's `config.json` without
safetensors beside it), so that every caller tells it from the other folders, but which
of its models to read (the final `model.keras`, else the newest checkpoint, else the one
before a damaged one) is the run's own logic: `keras_vit.training.runs.resolve_from`
chooses it and hands back the same `Source` bound to that file (`Source.at`). A reader
passed from training, or registered by it, would make what this module answers depend
on whether training was imported; a `Source` of a run folder read here without that
choice says where to read it instead.
"""

import dataclasses
import functools
import json
import os
import typing
import zipfile

from keras_vit.models.preprocessing import DEFAULT
from keras_vit.utils import paths
from keras_vit.weights import download, registry

# What a source is. `registry`, `timm` and `hf` name checkpoints that are fetched;
# `url` is a weights file (or, beyond http(s), a safetensors folder) at a URL whose
# name does not tell its format: its content does.
Kind = typing.Literal[
    "registry", "timm", "hf", "url", "npz", "safetensors", "hf_directory", "timm_directory",
    "keras", "orbax", "run",
]
KINDS = typing.get_args(Kind)
# The kinds that are whole Keras models (`keras_vit.utils.model_files.read_keras`).
MODELS = ("keras", "orbax", "run")
# The kinds that may describe their architecture (`Source.arguments`), which
# `keras_vit.pretrained` builds.
DESCRIBED = ("registry", "timm", "hf", "hf_directory", "timm_directory")

_MODEL_SUFFIXES = {".keras": "keras", ".orbax": "orbax"}
_WEIGHTS_SUFFIXES = {".npz": "npz", ".safetensors": "safetensors"}
_CONFIG = "config.json"


@dataclasses.dataclass(frozen=True)
class Source:
    """A weights source, resolved (`resolve_source`).

    Attributes:
        given: the source as it was named.
        kind: what it is (`KINDS`).
        location: where its files are: a local path or `gs://` URL, the `http(s)://`
            URL, registry name or Hub repository they are fetched from, or the run folder.
        entry: the registry entry of its checkpoint (a registry name, `timm:NAME` of
            one, a timm folder of one), or None.
        file: the local file or folder it is read from once known (a local source's
            own path, a run's model file); None until `path` fetches it.
    """

    given: str
    kind: Kind
    location: str
    entry: object = None
    file: typing.Optional[str] = None

    @functools.cached_property
    def path(self):
        """The file or folder to read: a local source's own path (or `gs://` URL), else
        the file fetched into the cache once (`keras_vit.weights.download`).

        Raises:
            ValueError: for a run folder not yet bound to one of its models.
            keras_vit.weights.download.DownloadError: a fetch that failed.
        """
        if self.file is not None:
            return self.file
        if self.kind == "run":
            raise ValueError(
                f"{self.given} is a keras-vit run folder: pass its model.keras (or a "
                "checkpoint), or load it with keras-vit --from "
                "(keras_vit.training.runs.load_model)."
            )
        if self.kind == "registry":
            return download.fetch(self.entry.url, sha256=self.entry.sha256, size=self.entry.size)
        if self.kind in ("timm", "hf"):
            return download.fetch_hub(self.given)
        return download.fetch(self.location)

    @property
    def is_model(self):
        """Whether it is a whole Keras model (`.keras`, `.orbax` or a run's model)."""
        return self.kind in MODELS

    @functools.cached_property
    def arguments(self):
        """The `keras_vit.ViT` arguments that build it as released: its registry entry's
        (`build_args`) or its HF `config.json`'s
        (`keras_vit.weights.formats.hf_model_arguments`); None for a source that does
        not describe its architecture. An `hf:` source is fetched to read it. A timm
        folder's own `config.json` comes first where its family reads it
        (`keras_vit.weights.formats.timm_model_arguments`): it records the sizes the
        model was created with, which its registry entry may not have."""
        if self.kind == "timm_directory":
            arguments = _formats().timm_model_arguments(self.path)
            if arguments is not None:
                return arguments
        if self.entry is not None:
            return self.entry.build_args()
        if self.kind in ("hf", "hf_directory"):
            return _formats().hf_model_arguments(self.path)
        return None

    @functools.cached_property
    def preprocessing(self):
        """The preprocessing its weights expect where it records one
        (`keras_vit.models.preprocessing`): its registry entry's unless `DEFAULT`, an HF
        folder's `preprocessor_config.json`, what a Keras model was built with; else
        None (pixels scaled to [-1, 1])."""
        if self.kind == "timm_directory" and self.arguments is not None:
            return self.arguments.get("preprocessing")
        if self.entry is not None:
            return None if self.entry.preprocessing == DEFAULT else self.entry.preprocessing
        if self.kind in ("hf", "hf_directory"):
            return _formats().hf_preprocessing(self.path)
        if self.is_model:
            return _recorded_preprocessing(self.path)
        return None

    def at(self, file):
        """The same source read from `file`: a run folder's model, as the run chooses it
        (`keras_vit.training.runs.resolve_from`), or one of its earlier checkpoints."""
        return dataclasses.replace(self, file=os.fspath(file))


def resolve_source(source):
    """The `Source` that `source` names; a `Source` is returned as it is.

    Nothing is downloaded (`Source.path` fetches on first use) and Keras is not
    imported: the command line checks its arguments with this before a backend starts.

    Args:
        source: a registry name (`keras_vit.list_weights()`), `timm:NAME`,
            `hf:ORG/NAME`, an `http(s)://` or `gs://` URL, or a local path (`str` or
            `os.PathLike`) of an `.npz`, `.safetensors`, `.keras` or `.orbax`
            checkpoint, an HF transformers or timm model folder, or a keras-vit run
            folder.

    Returns:
        The `Source`.

    Raises:
        FileNotFoundError: a local path that does not exist, or a folder that holds no
            checkpoint, named in one line.
        ValueError: an unknown registry name (`keras_vit.weights.registry.get_weights`'s
            line, with the names it may mean), or what is not a source at all.

    Example:

    >>> resolve_source("vit_base_patch16_224.augreg_in21k").kind
    'registry'
    >>> resolve_source("timm:deit_tiny_patch16_224.fb_in1k").entry.name
    'deit_tiny_patch16_224.fb_in1k'
    >>> resolve_source("gs://bucket/run/model.keras").is_model
    True
    >>> resolve_source("no_such_file.npz")
    Traceback (most recent call last):
    ...
    FileNotFoundError: Checkpoint no_such_file.npz does not exist.
    """
    if isinstance(source, Source):
        return source
    if not isinstance(source, (str, os.PathLike)) or not os.fspath(source):
        raise ValueError(
            "A weights source is a registry name, timm:NAME, hf:ORG/NAME, a URL or a path, "
            f"got {source!r}."
        )
    text = os.fspath(source)
    if registry.is_registered(text):
        entry = registry.get_weights(text)
        return Source(text, "registry", entry.url, entry)
    if text.startswith("timm:"):
        name = text[len("timm:"):]
        entry = registry.get_weights(name) if registry.is_registered(name) else None
        return Source(text, "timm", name, entry)
    if text.startswith("hf:"):
        return Source(text, "hf", text[len("hf:"):])
    suffix = os.path.splitext(text.rstrip("/"))[1]
    known = _MODEL_SUFFIXES.get(suffix) or _WEIGHTS_SUFFIXES.get(suffix)
    if text.startswith(("http://", "https://")):  # fetched into the cache (`path`)
        return Source(text, known or "url", text)
    remote = "://" in text  # gs:// and TensorFlow's other file systems: read in place
    if remote and known:
        return Source(text, known, text, file=text)
    if suffix == ".orbax" and paths.isdir(text):  # a sharded checkpoint is a folder
        return Source(text, "orbax", text, file=text)
    if paths.isdir(text):
        kind = _folder_kind(text)
        entry = _timm_entry(text) if kind == "timm_directory" else None
        return Source(text, kind, text, entry, None if kind == "run" else text)
    if remote:
        return Source(text, "url", text, file=text)
    if os.path.isfile(text):
        return Source(text, known or _sniffed(text), text, file=text)
    if suffix in _MODEL_SUFFIXES:
        raise FileNotFoundError(f"No such model file: {text!r}.")
    if suffix not in _WEIGHTS_SUFFIXES and os.sep not in text and "/" not in text:
        registry.get_weights(text)  # a name, not a path: the registry says what it may mean
    raise FileNotFoundError(f"Checkpoint {text} does not exist.")


def _folder_kind(folder):
    """What the folder `folder` holds: an HF transformers model (`config.json` with
    `architectures`), a timm model (its hub `config.json` names one `architecture`),
    safetensors alone, or a keras-vit run (its `config.json` without safetensors);
    a `FileNotFoundError` naming it when none of these."""
    config = paths.join(folder, _CONFIG)
    has_config = paths.exists(config)
    if _formats().holds_safetensors(folder):
        if not has_config:
            return "safetensors"
        return "timm_directory" if "architecture" in _read_json(config) else "hf_directory"
    if has_config:
        return "run"
    raise FileNotFoundError(
        f"Directory {folder} holds no model.safetensors or model.safetensors.index.json (an "
        "HF or timm model folder), nor the config.json of a keras-vit run."
    )


def _timm_entry(folder):
    """The registry entry of the timm model folder `folder` (its `config.json`'s
    `architecture` and `pretrained_cfg.tag`, timm's name for it), or None."""
    config = _read_json(paths.join(folder, _CONFIG))
    tag = (config.get("pretrained_cfg") or {}).get("tag")
    name = f"{config['architecture']}.{tag}" if tag else config["architecture"]
    return registry.get_weights(name) if registry.is_registered(name) else None


def _sniffed(path):
    """`npz` or `safetensors` for the weights file `path`, told by its first bytes (an
    `.npz` file is a zip archive), as the reader tells them."""
    with open(path, "rb") as f:
        return "npz" if f.read(4) == b"PK\x03\x04" else "safetensors"


def _formats():
    # Here, not at the top: the readers import ml_dtypes, which takes longer than the
    # command line's checks of its arguments (`keras_vit.cli.check_from`) should.
    from keras_vit.weights import formats

    return formats


def _read_json(path):
    """The JSON object in `path`, or `{}` where it holds none (the reader of its kind
    names what is wrong with it)."""
    try:
        config = json.loads(paths.read_bytes(path))
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def _recorded_preprocessing(path):
    """The `preprocessing` a Keras model file (or sharded checkpoint) was built with, from
    its saved configuration without building it; None where it records none."""
    if path.endswith(".orbax"):
        from keras_vit.utils import sharded_state  # imports JAX: an optional extra

        return sharded_state.architecture(path)["config"].get("preprocessing")
    with paths.open_binary(path) as file, zipfile.ZipFile(file) as archive:
        return json.loads(archive.read(_CONFIG))["config"].get("preprocessing")
