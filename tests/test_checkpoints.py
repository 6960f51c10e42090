"""Pretrained weights: logit parity with HF transformers through every checkpoint layout,
position-embedding resampling against scipy and torch, exact save/load round trips,
and a clear error for each kind of bad checkpoint.

The reference is a tiny HF `ViTForImageClassification` with every tensor randomised
(the default init's zero biases and unit norms would hide mapping mistakes). The other
layouts (official .npz, big_vision, timm) are written by this file's own converters
from the HF tensors, so each load is checked against HF's logits.
"""

import io
import logging

import keras
import numpy as np
import pytest
import scipy.ndimage
import tensorflow as tf
import torch
from safetensors.numpy import load_file, save_file
from safetensors.torch import save_file as torch_save_file
from transformers import ViTConfig, ViTForImageClassification, ViTModel

import keras_vit
from helpers import randomise_weights, tiny_vit
from references import randomise, timm_from_hf
from keras_vit.families.family import POS_KEY

HEADS, LAYERS, WIDTH = 4, 2, 32
CONFIG = dict(
    hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
    intermediate_size=64, image_size=32, patch_size=8, num_channels=3,
    layer_norm_eps=1e-6, hidden_act="gelu",
)



def as_numpy(x):
    return keras.ops.convert_to_numpy(x)


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """The HF model, its saved directory and file tensors, images and reference logits."""
    model = randomise(ViTForImageClassification(ViTConfig(num_labels=10, **CONFIG)), seed=1)
    directory = tmp_path_factory.mktemp("hf")
    model.save_pretrained(directory)
    images = np.random.default_rng(0).uniform(-1, 1, (3, 32, 32, 3)).astype("float32")
    with torch.no_grad():  # HF takes NCHW pixels
        logits = model(pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2))).logits
    return dict(
        model=model, directory=directory, files=load_file(directory / "model.safetensors"),
        images=images, logits=logits.numpy(),
    )


def official_from_hf(w):
    """HF file tensors -> the official vit_jax .npz layout (REFERENCE.md section 2)."""
    head_dim = WIDTH // HEADS
    out = {
        "cls": w["vit.embeddings.cls_token"],
        "embedding/kernel": w["vit.embeddings.patch_embeddings.projection.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": w["vit.embeddings.patch_embeddings.projection.bias"],
        POS_KEY: w["vit.embeddings.position_embeddings"],
        "Transformer/encoder_norm/scale": w["vit.layernorm.weight"],
        "Transformer/encoder_norm/bias": w["vit.layernorm.bias"],
        "head/kernel": w["classifier.weight"].T,
        "head/bias": w["classifier.bias"],
    }
    for i in range(LAYERS):
        hf, ours = f"vit.encoder.layer.{i}.", f"Transformer/encoderblock_{i}/"
        mha = ours + "MultiHeadDotProductAttention_1/"
        for name in ("query", "key", "value"):
            weight = w[f"{hf}attention.attention.{name}.weight"]  # (out, in)
            out[f"{mha}{name}/kernel"] = weight.T.reshape(WIDTH, HEADS, head_dim)
            out[f"{mha}{name}/bias"] = w[f"{hf}attention.attention.{name}.bias"].reshape(HEADS, head_dim)
        out[mha + "out/kernel"] = w[hf + "attention.output.dense.weight"].T.reshape(HEADS, head_dim, WIDTH)
        out[mha + "out/bias"] = w[hf + "attention.output.dense.bias"]
        for theirs, norm in (("layernorm_before", "LayerNorm_0"), ("layernorm_after", "LayerNorm_2")):
            out[f"{ours}{norm}/scale"] = w[f"{hf}{theirs}.weight"]
            out[f"{ours}{norm}/bias"] = w[f"{hf}{theirs}.bias"]
        for theirs, dense in (("intermediate.dense", "Dense_0"), ("output.dense", "Dense_1")):
            out[f"{ours}MlpBlock_3/{dense}/kernel"] = w[f"{hf}{theirs}.weight"].T
            out[f"{ours}MlpBlock_3/{dense}/bias"] = w[f"{hf}{theirs}.bias"]
    return out



def big_vision_from_official(official, scanned, prefix):
    """Official layout -> big_vision's: Linen sub-indices, no cls position row, scan."""
    renames = {
        "MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
        "LayerNorm_2": "LayerNorm_1",
        "MlpBlock_3": "MlpBlock_0",
    }
    pos = official[POS_KEY]
    out = {"cls": official["cls"] + pos[:, :1], "pos_embedding": pos[:, 1:]}
    blocks = {}
    for key, value in official.items():
        if key.startswith("Transformer/encoderblock_"):
            _, block, module, rest = key.split("/", 3)
            suffix = f"{renames.get(module, module)}/{rest}"
            blocks.setdefault(suffix, []).append((int(block.split("_")[1]), value))
            if not scanned:
                out[f"Transformer/{block}/{suffix}"] = value
        elif key not in ("cls", POS_KEY):
            out[key] = value
    if scanned:
        for suffix, layers in blocks.items():
            out[f"Transformer/encoderblock/{suffix}"] = np.stack([v for _, v in sorted(layers)])
    return {prefix + key: value for key, value in out.items()}


@pytest.fixture(scope="module")
def shared_model():
    """One default tiny ViT for the tests that load into it: a successful load overwrites
    all of its weights, a failed one changes none, so tests cannot leak into each other."""
    return tiny_vit()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A randomised default tiny ViT saved with save_npz: `(path, tensors)`."""
    path = tmp_path_factory.mktemp("saved") / "vit.npz"
    keras_vit.save_npz(randomised_vit(), path)
    return path, dict(np.load(path))


def max_logit_diff(model, hf):
    return np.abs(as_numpy(model(hf["images"])) - hf["logits"]).max()


def saved_npz(tmp_path, model):
    keras_vit.save_npz(model, tmp_path / "vit.npz")
    return dict(np.load(tmp_path / "vit.npz"))


def write_npz(tmp_path, tensors, name="bad.npz"):
    np.savez(tmp_path / name, **tensors)
    return tmp_path / name


def randomised_vit(seed=0, **overrides):
    model = tiny_vit(**overrides)
    randomise_weights(model, seed, scale=0.3)
    return model


# --- parity with HF transformers through each layout -------------------------------


@pytest.mark.parametrize("layout", ["directory", "file", "memory_names", "sharded"])
def test_hf_safetensors_logits_match_transformers(hf, shared_model, tmp_path, layout):
    source = hf["directory"]
    if layout == "file":
        source = hf["directory"] / "model.safetensors"
    elif layout == "memory_names":  # transformers 5.x module names: vit.layers.N.attention.q_proj
        state = {k: v.numpy() for k, v in hf["model"].state_dict().items()}
        assert "vit.layers.0.attention.q_proj.weight" in state
        source = tmp_path / "memory.safetensors"
        save_file(state, source)
    elif layout == "sharded":
        hf["model"].save_pretrained(tmp_path, max_shard_size="40KB")
        assert not (tmp_path / "model.safetensors").exists()
        source = tmp_path
    report = keras_vit.load_pretrained(shared_model, source)
    assert report.format == "hf" and not report.messages
    assert max_logit_diff(shared_model, hf) < 1e-4


def test_bfloat16_safetensors_load_as_their_float32_values(hf, shared_model, tmp_path):
    # numpy has no bfloat16: safetensors.numpy cannot read such files, the loader can.
    state = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in hf["files"].items()}
    torch_save_file(state, tmp_path / "model.safetensors")
    keras_vit.load_pretrained(shared_model, tmp_path)
    expected = state["vit.layernorm.weight"].float().numpy()
    np.testing.assert_array_equal(as_numpy(shared_model.get_layer("encoder_norm").gamma), expected)


def test_hf_vitmodel_pooler_loads_as_pre_logits(tmp_path):
    # ViTModel files have no "vit." prefix; their pooler (Dense + tanh on the class
    # token) is the official representation layer.
    base = randomise(ViTModel(ViTConfig(**CONFIG)), seed=2)
    base.save_pretrained(tmp_path)
    assert "embeddings.cls_token" in load_file(tmp_path / "model.safetensors")
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    with torch.no_grad():
        pooled = base(pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2))).pooler_output
    model = tiny_vit(include_top=False, representation_size=WIDTH)
    keras_vit.load_pretrained(model, tmp_path)
    assert np.abs(as_numpy(model(images)) - pooled.numpy()).max() < 1e-4


def test_official_npz_logits_match_transformers_and_save_npz_writes_it_back(hf, shared_model, tmp_path):
    official = official_from_hf(hf["files"])
    report = keras_vit.load_pretrained(shared_model, write_npz(tmp_path, official, "official.npz"))
    assert report.format == "vit_jax" and sorted(report.loaded) == sorted(official)
    assert max_logit_diff(shared_model, hf) < 1e-4
    written = saved_npz(tmp_path, shared_model)
    assert sorted(written) == sorted(official)
    for key, value in official.items():
        np.testing.assert_array_equal(written[key], value, err_msg=key)


def test_timm_safetensors_logits_match_transformers(hf, shared_model, tmp_path):
    save_file(timm_from_hf(hf["files"]), tmp_path / "timm.safetensors")
    assert keras_vit.load_pretrained(shared_model, tmp_path / "timm.safetensors").format == "timm"
    assert max_logit_diff(shared_model, hf) < 1e-4


@pytest.mark.parametrize(
    "scanned, prefix", [(True, "params/"), (False, "opt/target/"), (True, "params/img/")]
)
def test_big_vision_npz_logits_match_transformers(hf, shared_model, tmp_path, scanned, prefix):
    arrays = big_vision_from_official(official_from_hf(hf["files"]), scanned, prefix)
    outside = {"params/": "opt/state", "opt/target/": "opt/state", "params/img/": "params/txt/w"}
    arrays[outside[prefix]] = np.zeros(3)  # optimizer state, the text tower: not for the model
    report = keras_vit.load_pretrained(shared_model, write_npz(tmp_path, arrays, "bv.npz"))
    assert report.format == "big_vision"
    # An image-text checkpoint's text tower is named as HF's is.
    note = ("the text tower's 1 tensors are not loaded (an image model)." if "img" in prefix
            else f"ignored 1 tensors outside {prefix!r}.")
    assert note in report.messages
    np.testing.assert_array_equal(as_numpy(shared_model.get_layer("class_token").position), 0.0)
    assert max_logit_diff(shared_model, hf) < 1e-4


def test_big_vision_table_of_a_non_square_grid_loads_with_the_models_grid(tmp_path):
    # 16x40 px, patch 8: a 2x5 grid of 10 = 3*3 + 1 patches, which alone reads as a 3x3
    # grid after a class-token row. The model's grid says which it is.
    config = dict(CONFIG, image_size=(16, 40))
    model = randomise(ViTForImageClassification(ViTConfig(num_labels=10, **config)), seed=2)
    images = np.random.default_rng(1).uniform(-1, 1, (2, 16, 40, 3)).astype("float32")
    with torch.no_grad():
        expected = model(pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2))).logits.numpy()
    model.save_pretrained(tmp_path / "hf")
    files = load_file(tmp_path / "hf" / "model.safetensors")
    arrays = big_vision_from_official(official_from_hf(files), False, "params/")
    assert arrays["params/pos_embedding"].shape == (1, 10, WIDTH)
    vit = tiny_vit(image_size=(16, 40))
    report = keras_vit.load_pretrained(vit, write_npz(tmp_path, arrays, "bv.npz"))
    assert not [m for m in report.messages if "resampled" in m]
    np.testing.assert_allclose(as_numpy(vit(images)), expected, atol=1e-4)
    # 12 rows fit the 2x5 grid neither with nor without a class-token row, and neither
    # reading is a square grid: refused, not guessed.
    arrays["params/pos_embedding"] = np.zeros((1, 12, WIDTH), "float32")
    with pytest.raises(ValueError, match="patch grid of the 12 position embeddings"):
        keras_vit.load_pretrained(vit, write_npz(tmp_path, arrays, "bv12.npz"))


def test_a_non_square_grid_into_another_grid_is_refused_or_read_at_the_given_grid(tmp_path):
    # The 10 rows of a 2x5 big_vision table also read as a 3x3 grid after a class-token
    # row: into a 4x4 model that was a silent guess; now it asks for the grid.
    config = dict(CONFIG, image_size=(16, 40))
    model = randomise(ViTForImageClassification(ViTConfig(num_labels=10, **config)), seed=2)
    model.save_pretrained(tmp_path / "hf")
    files = load_file(tmp_path / "hf" / "model.safetensors")
    big_vision = write_npz(
        tmp_path, big_vision_from_official(official_from_hf(files), False, "params/"), "bv.npz"
    )
    vit = tiny_vit(image_size=32)
    with pytest.raises(ValueError, match=r"3x3 grid after a class-token row, or 2x5 without "
                       r"one; .*checkpoint_grid=\(rows, cols\)"):
        keras_vit.load_pretrained(vit, big_vision)
    # HF's table holds the class row: its 10 patch rows are no square; refused the same way.
    hf = tmp_path / "hf" / "model.safetensors"
    with pytest.raises(ValueError, match=r"10 is not square .* checkpoint_grid=\(rows, cols\)"):
        keras_vit.load_pretrained(vit, hf)
    with pytest.raises(ValueError, match=r"checkpoint_grid=\(3, 3\) has 9 patches, but "):
        keras_vit.load_pretrained(vit, hf, checkpoint_grid=(3, 3))
    # Given the grid, both formats load the same weights into the 4x4 model.
    # (big_vision folds the class row into the token, so the logits are compared.)
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    keras_vit.load_pretrained(vit, big_vision, checkpoint_grid=(2, 5))
    from_big_vision = as_numpy(vit(images))
    report = keras_vit.load_pretrained(vit, hf, checkpoint_grid=(2, 5),
                                       interpolation="bilinear_align_corners")
    assert "resampled from a 2x5 to a 4x4 patch grid" in " ".join(report.messages)
    np.testing.assert_allclose(as_numpy(vit(images)), from_big_vision, atol=1e-5)
    # Into a model of the same (non-square) count, the model's grid is read, and said.
    report = keras_vit.load_pretrained(tiny_vit(image_size=(40, 16)), big_vision)
    assert "read as the model's 5x2 patch grid (pass checkpoint_grid" in " ".join(report.messages)


def test_url_sources_read_and_write_through_tf_gfile(hf, shared_model):
    # gs:// goes through tf.io.gfile; TensorFlow's in-memory ram:// file system takes
    # the same code path without a network.
    official = official_from_hf(hf["files"])
    buffer = io.BytesIO()
    np.savez(buffer, **official)
    with tf.io.gfile.GFile("ram://keras_vit_test/official.npz", "wb") as f:
        f.write(buffer.getvalue())
    keras_vit.load_pretrained(shared_model, "ram://keras_vit_test/official.npz")
    assert max_logit_diff(shared_model, hf) < 1e-4
    keras_vit.save_npz(shared_model, "ram://keras_vit_test/saved.npz")
    with tf.io.gfile.GFile("ram://keras_vit_test/saved.npz", "rb") as f:
        written = np.load(io.BytesIO(f.read()))
        for key, value in official.items():
            np.testing.assert_array_equal(written[key], value, err_msg=key)


# --- resolution changes ---------------------------------------------------------------

SIZES = [((4, 4), (6, 6)), ((4, 4), (7, 5)), ((6, 6), (4, 3)), ((14, 14), (24, 24)), ((3, 5), (1, 2))]


def torch_bicubic_antialias(grid, size):
    nchw = torch.from_numpy(grid).permute(2, 0, 1)[None]
    out = torch.nn.functional.interpolate(
        nchw, size=size, mode="bicubic", antialias=True, align_corners=False
    )
    return out[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize("old, new", SIZES)
def test_bilinear_align_corners_equals_scipy_zoom(old, new):
    grid = np.random.default_rng(0).normal(size=(*old, 8)).astype("float32")
    expected = scipy.ndimage.zoom(grid, (new[0] / old[0], new[1] / old[1], 1), order=1)
    resampled = keras_vit.resample_position_grid(grid, new, "bilinear_align_corners")
    np.testing.assert_allclose(resampled, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("old, new", SIZES)
def test_bicubic_antialias_equals_torch_interpolate(old, new):
    grid = np.random.default_rng(0).normal(size=(*old, 8)).astype("float32")
    resampled = keras_vit.resample_position_grid(grid, new, "bicubic_antialias")
    np.testing.assert_allclose(resampled, torch_bicubic_antialias(grid, new), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "image_size, interpolation, method",
    [(48, None, "bilinear_align_corners"), ((32, 48), "bicubic_antialias", "bicubic_antialias")],
)
def test_weights_load_into_a_larger_resolution_model(saved, image_size, interpolation, method):
    path, tensors = saved
    large = tiny_vit(image_size=image_size)
    report = keras_vit.load_pretrained(large, path, interpolation=interpolation)
    rows, cols = large.get_layer("patch_encoder").grid_size
    assert report.messages == [
        f"position embedding resampled from a 4x4 to a {rows}x{cols} patch grid ({method})."
    ]
    grid = tensors[POS_KEY][0, 1:].reshape(4, 4, WIDTH)
    expected = (
        scipy.ndimage.zoom(grid, (rows / 4, cols / 4, 1), order=1)
        if method == "bilinear_align_corners"
        else torch_bicubic_antialias(grid, (rows, cols))
    )
    position = as_numpy(large.get_layer("patch_encoder").position)
    np.testing.assert_allclose(position, expected.reshape(1, -1, WIDTH), rtol=0, atol=1e-5)
    class_row = as_numpy(large.get_layer("class_token").position)
    np.testing.assert_array_equal(class_row, tensors[POS_KEY][:, :1])
    height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
    logits = as_numpy(large(np.random.default_rng(0).uniform(-1, 1, (2, height, width, 3))))
    assert logits.shape == (2, 10) and np.all(np.isfinite(logits)) and np.std(logits) > 0


def test_learned2d_tables_resample_rows_and_columns_separately(tmp_path):
    small = randomised_vit(pos_embedding="learned2d")
    keras_vit.save_npz(small, tmp_path / "vit.npz")
    tall = tiny_vit(image_size=(48, 32), pos_embedding="learned2d")  # 4x4 -> 6x4 patches
    keras_vit.load_pretrained(tall, tmp_path / "vit.npz")
    small_encoder, tall_encoder = small.get_layer("patch_encoder"), tall.get_layer("patch_encoder")
    rows = as_numpy(small_encoder.row_position)  # (4, 1, D/2)
    expected = scipy.ndimage.zoom(rows, (6 / 4, 1, 1), order=1)
    np.testing.assert_allclose(as_numpy(tall_encoder.row_position), expected, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(
        as_numpy(tall_encoder.col_position), as_numpy(small_encoder.col_position)
    )


def test_hf_weights_resample_bicubically_by_default(hf):
    model = tiny_vit(image_size=48)
    keras_vit.load_pretrained(model, hf["directory"])
    grid = hf["files"]["vit.embeddings.position_embeddings"][0, 1:].reshape(4, 4, WIDTH)
    expected = torch_bicubic_antialias(grid, (6, 6)).reshape(1, 36, WIDTH)
    position = as_numpy(model.get_layer("patch_encoder").position)
    np.testing.assert_allclose(position, expected, rtol=0, atol=1e-5)


# --- save_npz round trips ---------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        dict(representation_size=16),
        dict(classifier="gap", pos_embedding="learned2d"),
        dict(pos_embedding="sincos2d"),
        dict(classifier="gap", pos_embedding="none", include_top=False),
    ],
)
def test_save_npz_then_load_round_trips_exactly(tmp_path, overrides):
    model = randomised_vit(**overrides)
    tensors = saved_npz(tmp_path, model)
    tokens = 16 + (overrides.get("classifier", "token") == "token")
    assert tensors[POS_KEY].shape == (1, tokens, WIDTH)
    assert ("cls" in tensors) == (tokens == 17)
    originals = [as_numpy(v) for v in model.weights]
    randomise_weights(model, seed=1, scale=1.0)  # only the load can bring the originals back
    report = keras_vit.load_pretrained(model, tmp_path / "vit.npz")
    assert not (report.missing or report.unexpected or report.mismatched or report.messages)
    for original, v in zip(originals, model.weights):
        np.testing.assert_array_equal(as_numpy(v), original, err_msg=v.path)


# --- heads and pre_logits -----------------------------------------------------------------


def test_head_with_other_class_count_is_reset_to_zeros(saved, caplog):
    path, tensors = saved
    model = randomised_vit(seed=1, num_classes=5)
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        report = keras_vit.load_pretrained(model, path)
    message = "the checkpoint's head has 10 classes, the model 5: the head is reset to zeros."
    assert report.messages == [message] and message in caplog.text
    np.testing.assert_array_equal(as_numpy(model.get_layer("head").kernel), 0.0)
    np.testing.assert_array_equal(as_numpy(model.get_layer("head").bias), 0.0)
    np.testing.assert_array_equal(
        as_numpy(model.get_layer("encoder_norm").gamma), tensors["Transformer/encoder_norm/scale"]
    )


def test_pre_logits_dropped_when_model_has_none_and_headless_checkpoint_resets_head(
    shared_model, tmp_path
):
    saved_npz(tmp_path, randomised_vit(representation_size=16, include_top=False))
    report = keras_vit.load_pretrained(shared_model, tmp_path / "vit.npz")
    assert report.messages == [
        "the model has no pre_logits layer (representation_size=None): the checkpoint's "
        "pre_logits (32, 16) is dropped.",
        "the checkpoint has no head: the head is reset to zeros.",
    ]
    np.testing.assert_array_equal(as_numpy(shared_model.get_layer("head").kernel), 0.0)


# --- bad checkpoints ---------------------------------------------------------------------


def test_missing_unexpected_and_mis_shaped_tensors_are_all_listed_with_shapes(
    saved, shared_model, tmp_path
):
    tensors = dict(saved[1])
    del tensors["Transformer/encoderblock_1/LayerNorm_2/scale"]
    tensors["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"] = np.zeros((32, 48), "float32")
    tensors["extra/kernel"] = np.zeros((2, 3), "float32")
    with pytest.raises(ValueError) as error:
        keras_vit.load_pretrained(shared_model, write_npz(tmp_path, tensors))
    message = str(error.value)
    assert "bad.npz" in message
    assert "missing Transformer/encoderblock_1/LayerNorm_2/scale: checkpoint -, model (32,)" in message
    assert (
        "mis-shaped Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel: "
        "checkpoint (32, 48), model (32, 64)" in message
    )
    assert "unexpected extra/kernel: checkpoint (2, 3), model -" in message


def test_hf_mis_shaped_tensor_names_its_source_key(hf, shared_model, tmp_path):
    files = dict(hf["files"])
    files["vit.encoder.layer.1.output.dense.weight"] = np.zeros((32, 48), "float32")
    save_file(files, tmp_path / "model.safetensors")
    expected = (
        r"Dense_1/kernel \(from vit\.encoder\.layer\.1\.output\.dense\.weight\): "
        r"checkpoint \(48, 32\), model \(64, 32\)"
    )
    with pytest.raises(ValueError, match=expected):
        keras_vit.load_pretrained(shared_model, tmp_path)


def test_position_table_without_a_patch_grid_is_an_error(saved, shared_model, tmp_path):
    tensors = dict(saved[1])
    tensors[POS_KEY] = tensors[POS_KEY][:, :11]  # the cls row and 10 patches: no grid
    with pytest.raises(ValueError, match="patch grid of the 10 position embeddings in .*bad.npz"):
        keras_vit.load_pretrained(shared_model, write_npz(tmp_path, tensors))


def test_strict_false_loads_what_fits_and_reports_the_rest(saved, tmp_path, caplog):
    tensors = dict(saved[1])
    tensors["embedding/bias"] = np.zeros(31, "float32")
    tensors["extra/kernel"] = np.zeros((2, 3), "float32")
    model = tiny_vit(num_layers=3)
    bias_before = as_numpy(model.get_layer("patch_encoder").projection.bias)
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        report = keras_vit.load_pretrained(model, write_npz(tmp_path, tensors), strict=False)
    # One logged line says what was left out.
    (line,) = [r.getMessage() for r in caplog.records if "strict=False" in r.getMessage()]
    assert f"loaded {len(tensors) - 2} tensors" in line
    assert f"{len(report.missing)} missing from the checkpoint" in line
    assert "1 unexpected, ignored (extra/kernel)" in line
    assert "1 mis-shaped, skipped (embedding/bias)" in line
    assert report.unexpected == ["extra/kernel"]
    assert report.mismatched == [("embedding/bias", (31,), (32,))]
    assert sorted(report.missing) == sorted(
        k.replace("encoderblock_1", "encoderblock_2") for k in tensors if "encoderblock_1/" in k
    )
    assert len(report.loaded) == len(tensors) - 2
    bias_after = as_numpy(model.get_layer("patch_encoder").projection.bias)
    np.testing.assert_array_equal(bias_after, bias_before)
    qkv = as_numpy(model.get_layer("encoderblock_1").qkv.kernel)
    key = tensors["Transformer/encoderblock_1/MultiHeadDotProductAttention_1/key/kernel"]
    np.testing.assert_array_equal(qkv[:, WIDTH : 2 * WIDTH], key.reshape(WIDTH, WIDTH))


@pytest.mark.parametrize("suffix", ["npz", "safetensors"])
def test_truncated_file_error_names_the_file(hf, saved, shared_model, tmp_path, suffix):
    good = saved[0] if suffix == "npz" else hf["directory"] / "model.safetensors"
    data = good.read_bytes()
    path = tmp_path / f"truncated.{suffix}"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=f"Cannot read checkpoint .*truncated.{suffix}: it is truncated"):
        keras_vit.load_pretrained(shared_model, path)


def test_unknown_layout_error_lists_the_keys_it_saw(shared_model, tmp_path):
    write_npz(tmp_path, {"encoder/w": np.zeros(2), "decoder/w": np.zeros(2)}, "other.npz")
    save_file({"encoder.w": np.zeros(2), "decoder.w": np.zeros(2)}, tmp_path / "other.safetensors")
    for name, keys in (("other.npz", "decoder/w, encoder/w"), ("other.safetensors", "decoder.w, encoder.w")):
        with pytest.raises(ValueError, match=f"Unknown checkpoint layout in .*{name}: .* 2 tensors, e.g. {keys}"):
            keras_vit.load_pretrained(shared_model, tmp_path / name)


def test_class_token_and_gap_mismatch_is_an_error(saved, shared_model, tmp_path):
    path, tensors = saved
    with pytest.raises(ValueError, match="classifier='token' model .* model uses classifier='gap'"):
        keras_vit.load_pretrained(tiny_vit(classifier="gap"), path)
    gap = {k: v for k, v in tensors.items() if k != "cls"}
    gap[POS_KEY] = tensors[POS_KEY][:, 1:]
    with pytest.raises(ValueError, match="classifier='gap' model .* model uses classifier='token'"):
        keras_vit.load_pretrained(shared_model, write_npz(tmp_path, gap))


@pytest.mark.parametrize(
    "pos_embedding, message",
    [
        ("learned2d", "a pos_embedding='learned2d' model .* cannot hold"),
        ("sincos2d", "the fixed pos_embedding='sincos2d': build the model with pos_embedding='learned'"),
        ("none", "the fixed pos_embedding='none': build the model with pos_embedding='learned'"),
    ],
)
def test_learned_table_into_other_position_embedding_is_an_error(saved, pos_embedding, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.load_pretrained(tiny_vit(pos_embedding=pos_embedding), saved[0])


def test_a_plain_checkpoint_leaves_the_hybrid_trunk_reported_missing(saved):
    hybrid = tiny_vit(image_size=64, patch_size=2, resnet_stages=())
    with pytest.raises(ValueError, match=r"missing conv_root/kernel: checkpoint -, model \(7, 7, 3, 64\)"):
        keras_vit.load_pretrained(hybrid, saved[0])
    report = keras_vit.load_pretrained(hybrid, saved[0], strict=False)
    assert {"conv_root/kernel", "gn_root/scale", "gn_root/bias"} <= set(report.missing)


def _official_hybrid_keys(stage_units):
    """The trunk keys of vit_jax's models_resnet for these stages, written out by hand."""
    keys = {"conv_root/kernel", "gn_root/scale", "gn_root/bias"}
    for s, units in enumerate(stage_units, 1):
        for u in range(1, units + 1):
            parts = ["1", "2", "3"] + (["_proj"] if u == 1 else [])
            for part in parts:
                keys |= {f"block{s}/unit{u}/conv{part}/kernel", f"block{s}/unit{u}/gn{part}/scale",
                         f"block{s}/unit{u}/gn{part}/bias"}
    return keys


def test_hybrid_round_trips_through_the_official_layout(tmp_path):
    model = tiny_vit(image_size=32, patch_size=1, num_layers=1, resnet_stages=(1, 1))
    rng = randomise_weights(model, seed=11)
    path = tmp_path / "hybrid.npz"
    keras_vit.save_npz(model, path)
    saved = dict(np.load(path))
    assert _official_hybrid_keys((1, 1)) <= set(saved)
    assert not {k for k in saved if k.split("/")[0] not in ("Transformer", "embedding", "cls", "head")} - _official_hybrid_keys((1, 1))

    # Older files carry GroupNorm parameters with singleton dims.
    singleton = {k: (v.reshape(1, 1, 1, -1) if "/gn" in "/" + k else v) for k, v in saved.items()}
    np.savez(tmp_path / "singleton.npz", **singleton)
    x = rng.uniform(-1, 1, size=(2, 32, 32, 3)).astype("float32")
    for source in (path, tmp_path / "singleton.npz"):
        fresh = tiny_vit(image_size=32, patch_size=1, num_layers=1, resnet_stages=(1, 1))
        keras_vit.load_pretrained(fresh, source)
        np.testing.assert_array_equal(np.asarray(fresh(x)), np.asarray(model(x)))
        for a, b in zip(fresh.weights, model.weights):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_arguments_are_named(shared_model, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.npz does not exist"):
        keras_vit.load_pretrained(shared_model, tmp_path / "nowhere.npz")
    with pytest.raises(FileNotFoundError, match="holds no model.safetensors"):
        keras_vit.load_pretrained(shared_model, tmp_path)
    with pytest.raises(ValueError, match="Unknown interpolation 'cubic'"):
        keras_vit.load_pretrained(shared_model, tmp_path, interpolation="cubic")
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=r"Model 'sequential.*' \(Sequential\) is not a keras_vit.ViT"):
        keras_vit.save_npz(other, tmp_path / "x.npz")
