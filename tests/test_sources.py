"""`keras_vit.weights.sources.resolve_source`: every kind of source resolves to the
description of what it is, built here from real files (a tiny model saved as `.keras`,
`.npz` and safetensors, an HF folder written by transformers' `save_pretrained`, a timm
folder in timm's hub layout, a run folder, a URL on a loopback server). Each
description is checked against the files' own statement (HF's config and processor,
the registry entry, the bytes served) or by an exact round trip of the weights; a bad
source is refused in one line that names it. Nothing is downloaded from outside."""

import dataclasses
import json
import os
import re
import shutil

import numpy as np
import pytest

import keras_vit
from helpers import ROOT, bucket_entry, bucket_model, tiny_vit
from keras_vit.models.preprocessing import model_preprocessing
from keras_vit.weights import download, registry
from keras_vit.weights.sources import KINDS, Source, resolve_source

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

HF_TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=64)
DEIT = "deit_tiny_patch16_224.fb_in1k"


def _weights(model):
    return [np.asarray(w) for w in model.get_weights()]


def _assert_same_weights(a, b):
    for x, y in zip(_weights(a), _weights(b), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny random transformers ViTModel with its image processor, as save_pretrained
    writes them."""
    folder = tmp_path_factory.mktemp("hf") / "vit"
    torch.manual_seed(0)
    transformers.ViTModel(transformers.ViTConfig(**HF_TINY)).eval().save_pretrained(folder)
    transformers.ViTImageProcessor(
        size={"height": 32, "width": 32}, resample=3, image_mean=[0.4, 0.45, 0.5],
        image_std=[0.2, 0.25, 0.3],
    ).save_pretrained(folder)
    return folder


def test_registry_names_timm_and_hf_resolve_without_a_download(tmp_path, monkeypatch):
    monkeypatch.setenv(download.CACHE_ENV, str(tmp_path / "cache"))
    entry = registry.get_weights(DEIT)
    source = resolve_source(DEIT)
    assert (source.kind, source.entry, source.location) == ("registry", entry, entry.url)
    assert source.arguments == entry.build_args()
    assert source.preprocessing == entry.preprocessing  # DeiT's ImageNet statistics

    timm = resolve_source("timm:" + DEIT)
    assert (timm.kind, timm.entry, timm.location) == ("timm", entry, DEIT)
    assert timm.arguments == entry.build_args() and timm.preprocessing == entry.preprocessing
    # timm:NAME of no registry entry loads, but describes nothing.
    other = resolve_source("timm:vit_unknown_patch16_224.none")
    assert (other.entry, other.arguments, other.preprocessing) == (None, None, None)

    hub = resolve_source("hf:google/vit-base-patch16-224")
    assert (hub.kind, hub.location, hub.entry) == ("hf", "google/vit-base-patch16-224", None)
    # Vit_jax's checkpoints expect the default [-1, 1] pixels: no preprocessing recorded.
    assert resolve_source("vit_base_patch16_224.augreg_in21k").preprocessing is None
    assert not os.path.exists(tmp_path / "cache")  # nothing was fetched


def test_a_registry_source_is_fetched_once_and_loads(bucket):
    entry = bucket_entry("vit_tiny_sources.test", "tiny/sources.npz")
    served = bucket_model(seed=3)
    bucket.put("tiny/sources.npz", served)
    source = resolve_source(entry.name)
    assert bucket.requests == [] and source.file is None
    assert source.path == download.cached(entry) and bucket.requests == ["/tiny/sources.npz"]
    model = keras_vit.ViT(weights=source)
    _assert_same_weights(model, served)
    assert bucket.requests == ["/tiny/sources.npz"]  # the Source fetched it once


def test_a_url_resolves_to_the_served_file(bucket, tmp_path):
    original = tiny_vit()
    served = bucket.put("files/weights.npz", original)
    shutil.copy(bucket.root / "files" / "weights.npz", bucket.root / "files" / "weights")
    base = os.environ[download.MIRROR_ENV]
    source = resolve_source(base + "files/weights.npz")
    assert (source.kind, source.location, source.file) == ("npz", base + "files/weights.npz", None)
    with open(source.path, "rb") as f:
        assert f.read() == served
    # A name that does not tell the format: its content does (an .npz is a zip archive).
    bare = resolve_source(base + "files/weights")
    assert bare.kind == "url"
    model = tiny_vit()
    keras_vit.load_pretrained(model, bare)
    _assert_same_weights(model, original)


def test_npz_and_safetensors_files_resolve_by_name_and_by_content(tmp_path, hf_folder):
    model = tiny_vit()
    path = str(tmp_path / "vit.npz")
    keras_vit.save_npz(model, path)
    source = resolve_source(path)
    assert (source.kind, source.path, source.entry, source.arguments) == ("npz", path, None, None)
    assert source.preprocessing is None and not source.is_model
    loaded = tiny_vit()
    keras_vit.load_pretrained(loaded, source)
    _assert_same_weights(loaded, model)

    tensors = str(hf_folder / "model.safetensors")
    assert resolve_source(tensors).kind == "safetensors"
    for original, kind in ((path, "npz"), (tensors, "safetensors")):
        renamed = str(tmp_path / f"{kind}.bin")
        shutil.copy(original, renamed)
        assert resolve_source(renamed).kind == kind
    shards = tmp_path / "shards"
    shards.mkdir()
    shutil.copy(tensors, shards / "model.safetensors")
    assert resolve_source(shards).kind == "safetensors"  # no config.json: weights only


def test_an_hf_folder_describes_the_model_its_config_and_processor_state(hf_folder):
    source = resolve_source(hf_folder)
    assert (source.kind, source.path, source.entry) == ("hf_directory", str(hf_folder), None)
    config = json.loads((hf_folder / "config.json").read_text())
    arguments = source.arguments
    assert (arguments["image_size"], arguments["patch_size"], arguments["hidden_dim"],
            arguments["num_layers"], arguments["num_heads"], arguments["mlp_dim"]) == (
        config["image_size"], config["patch_size"], config["hidden_size"],
        config["num_hidden_layers"], config["num_attention_heads"], config["intermediate_size"])
    processor = json.loads((hf_folder / "preprocessor_config.json").read_text())
    assert list(source.preprocessing["mean"]) == processor["image_mean"]
    assert list(source.preprocessing["std"]) == processor["image_std"]
    assert source.preprocessing["interpolation"].startswith("bicubic")  # resample=3
    model = keras_vit.pretrained(source)
    reference = transformers.ViTModel.from_pretrained(hf_folder).eval()
    pixels = np.random.default_rng(0).uniform(-1, 1, (1, 32, 32, 3)).astype("float32")
    with torch.no_grad():
        expected = reference(torch.from_numpy(pixels.transpose(0, 3, 1, 2))).pooler_output
    np.testing.assert_allclose(np.asarray(model(pixels)), expected.numpy(), atol=2e-5)


def test_a_timm_folder_names_its_registry_entry(tmp_path, hf_folder):
    folder = tmp_path / "timm"
    folder.mkdir()
    shutil.copy(hf_folder / "model.safetensors", folder / "model.safetensors")
    # timm's hub config.json: the architecture and the pretrained tag name the checkpoint.
    (folder / "config.json").write_text(json.dumps(dict(
        architecture="deit_tiny_patch16_224", num_classes=1000,
        pretrained_cfg=dict(tag="fb_in1k"))))
    source = resolve_source(folder)
    entry = registry.get_weights(DEIT)
    assert (source.kind, source.entry, source.path) == ("timm_directory", entry, str(folder))
    assert source.arguments == entry.build_args()
    (folder / "config.json").write_text(json.dumps(dict(architecture="vit_unknown_patch16")))
    unknown = resolve_source(folder)
    assert (unknown.kind, unknown.entry, unknown.arguments) == ("timm_directory", None, None)


def test_keras_files_and_sharded_checkpoints_are_models_with_their_preprocessing(tmp_path):
    recorded = registry.get_weights(DEIT).preprocessing
    model = tiny_vit(preprocessing=recorded)
    path = str(tmp_path / "vit.keras")
    model.save(path)
    source = resolve_source(path)
    assert (source.kind, source.path, source.is_model) == ("keras", path, True)
    assert source.preprocessing == model_preprocessing(model)
    assert source.preprocessing["mean"] == list(recorded["mean"])
    loaded = tiny_vit()
    keras_vit.load_pretrained(loaded, source)
    _assert_same_weights(loaded, model)

    sharded = tmp_path / "epoch_0001.orbax"
    sharded.mkdir()  # a sharded checkpoint is a folder: its name tells it
    assert (resolve_source(sharded).kind, resolve_source(sharded).is_model) == ("orbax", True)


def test_a_run_folder_is_told_by_its_files_and_read_through_training(tmp_path):
    from keras_vit.training import runs

    run = tmp_path / "run"
    (run / runs.CHECKPOINTS).mkdir(parents=True)
    (run / runs.CONFIG).write_text("{}")
    model = tiny_vit(preprocessing=registry.get_weights(DEIT).preprocessing)
    model.save(run / runs.CHECKPOINTS / "epoch_0001.keras")
    source = resolve_source(run)
    assert (source.kind, source.location, source.file, source.is_model) == (
        "run", str(run), None, True)
    # weights/ does not choose a run's model: it says where that is done.
    with pytest.raises(ValueError, match=f"^{run} is a keras-vit run folder: pass its model"):
        source.path
    bound = runs.resolve_from(str(run))
    assert bound == dataclasses.replace(
        source, file=str(run / runs.CHECKPOINTS / "epoch_0001.keras"))
    assert runs.resolve_from(bound) is bound
    assert bound.preprocessing == model_preprocessing(model)
    _assert_same_weights(runs.load_model(str(run)), model)


def test_a_source_passes_through_and_stays_as_resolved(tmp_path):
    source = resolve_source(DEIT)
    assert resolve_source(source) is source
    assert source.kind in KINDS and isinstance(source, Source)
    with pytest.raises(dataclasses.FrozenInstanceError):
        source.kind = "npz"


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "nowhere.npz", "^Checkpoint {tmp}/nowhere.npz does not exist.$"),
    (lambda tmp: tmp / "nowhere.keras", "^No such model file: '{tmp}/nowhere.keras'.$"),
    (lambda tmp: "vit_base_patch16_224.augreg_in21kk",
     "^Unknown weights 'vit_base_patch16_224.augreg_in21kk': did you mean "
     "vit_base_patch16_224.augreg_in21k"),
    (lambda tmp: tmp, "^Directory {tmp} holds no model.safetensors"),
    (lambda tmp: 42, "^A weights source is a registry name, .* got 42.$"),
    (lambda tmp: "", "^A weights source is a registry name, .* got ''.$"),
])
def test_a_bad_source_is_one_line_naming_it(tmp_path, make, message):
    with pytest.raises((FileNotFoundError, ValueError)) as raised:
        resolve_source(make(tmp_path))
    text = str(raised.value)
    assert "\n" not in text
    assert re.search(message.format(tmp=re.escape(str(tmp_path))), text), text


def test_resolving_imports_no_backend(tmp_path):
    """The command line checks `--from` with `resolve_source` before Keras starts: a
    fresh process resolves a name and a file without importing Keras, a backend or the
    format readers (ml_dtypes), and a run folder without Keras or a backend."""
    import subprocess
    import sys

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (tmp_path / "vit.npz").write_bytes(b"PK\x03\x04")
    script = (
        "import json, sys\n"
        "from keras_vit.weights.sources import resolve_source\n"
        "heavy = lambda: [m for m in ('keras', 'tensorflow', 'jax', 'torch', 'ml_dtypes')\n"
        "                 if m in sys.modules]\n"
        f"kinds = [resolve_source(s).kind for s in ({DEIT!r}, {str(tmp_path / 'vit.npz')!r})]\n"
        "before = heavy()\n"
        f"kinds.append(resolve_source({str(run)!r}).kind)\n"
        "print(json.dumps([kinds, before, [m for m in heavy() if m != 'ml_dtypes']]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert json.loads(out) == [["registry", "npz", "run"], [], []]
