"""NaFlex (`ViT(naflex=True)`, SigLIP 2's native resolution): images of several sizes in
one padded batch, against HF transformers' `Siglip2VisionModel` and
`Siglip2ImageProcessor`, torch's `F.interpolate`, and the same model run on each image
alone at its fixed size.

The module runs on the current backend; tests/test_backends_*.py runs it on the others.
"""

import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import torch
import transformers

import keras_vit
from family_contract import as_numpy, predicted, relative_error
from helpers import assert_keras_file_round_trip, clean_environment, randomise_weights
from keras_vit.families import dinov3
from keras_vit.layers import posembed
from keras_vit.layers.naflex import NaFlexPatches
from keras_vit.models.architecture import Architecture
from references import randomise

PATCH, WIDTH = 8, 32
HF_SIZES = dict(hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, num_patches=16, patch_size=PATCH)
TINY = dict(image_size=4 * PATCH, patch_size=PATCH, hidden_dim=WIDTH, num_layers=2,
            num_heads=4, mlp_dim=64, include_top=False, naflex=True)
# Patch grids of several aspect ratios, up- and down-sampling the 4x4 table, padded to 16.
GRIDS = [(3, 5), (4, 4), (2, 7), (6, 2), (1, 1)]
TOKENS = 16


def _batch(grids=GRIDS, tokens=TOKENS, seed=0):
    """A NaFlex batch of random pixels in [-1, 1]: its inputs, and each image."""
    rng = np.random.default_rng(seed)
    images = [rng.uniform(-1, 1, (h * PATCH, w * PATCH, 3)).astype("float32") for h, w in grids]
    patches = np.zeros((len(grids), tokens, PATCH * PATCH * 3), "float32")
    for i, image in enumerate(images):  # row-major patches, (row, col, channel) inside each
        h, w = grids[i]
        cut = image.reshape(h, PATCH, w, PATCH, 3).transpose(0, 2, 1, 3, 4).reshape(h * w, -1)
        patches[i, : h * w] = cut
    counts = np.prod(grids, axis=1)
    mask = (np.arange(tokens)[None] < counts[:, None]).astype("int32")
    inputs = {"patches": patches, "patch_mask": mask,
              "spatial_shapes": np.asarray(grids, "int32")}
    return inputs, images


def _hf(model, inputs, **kwargs):
    with torch.no_grad():
        return model(pixel_values=torch.from_numpy(inputs["patches"]),
                     pixel_attention_mask=torch.from_numpy(inputs["patch_mask"]),
                     spatial_shapes=torch.from_numpy(inputs["spatial_shapes"]), **kwargs)


def _real_tokens(tokens, inputs):
    """The tokens of the real patches, image after image."""
    mask = inputs["patch_mask"].astype(bool)
    return np.concatenate([tokens[i][mask[i]] for i in range(len(mask))])


@pytest.fixture(scope="module")
def siglip2(tmp_path_factory):
    """A tiny random HF Siglip2VisionModel saved with its processor; its pooler output and
    last hidden state on the mixed batch."""
    directory = tmp_path_factory.mktemp("siglip2")
    hf = randomise(transformers.Siglip2VisionModel(transformers.Siglip2VisionConfig(**HF_SIZES)),
                   seed=3).eval()
    hf.save_pretrained(directory)
    transformers.Siglip2ImageProcessorPil(patch_size=PATCH, max_num_patches=TOKENS).save_pretrained(
        directory)
    inputs, _ = _batch()
    out = _hf(hf, inputs)
    return directory, out.pooler_output.numpy(), _real_tokens(out.last_hidden_state.numpy(), inputs)


def _tokens_model(model):
    """`model`'s pooled output and its final normed tokens."""
    tokens = model.get_layer("encoder_norm").output
    return keras.Model(model.input, [model.output, tokens])


# --- the position table, resampled per image --------------------------------------------

_TORCH_MODES = {  # keras-vit's name -> torch's F.interpolate arguments
    "bilinear_antialias": dict(mode="bilinear", antialias=True, align_corners=False),
    "bicubic_antialias": dict(mode="bicubic", antialias=True, align_corners=False),
    "bilinear_align_corners": dict(mode="bilinear", align_corners=True),
    "bicubic": dict(mode="bicubic", align_corners=False),
}


@pytest.mark.parametrize("interpolation", posembed.INTERPOLATIONS)
@pytest.mark.parametrize("table", [(4, 4), (5, 3)])
def test_positions_per_token_equal_torch_interpolate_per_image(interpolation, table):
    """Every token's position is the table resized to its image's grid by torch (up,
    down, non-square, a single patch), at its row and column."""
    rng = np.random.default_rng(1)
    grid = rng.normal(size=(*table, 6)).astype("float32")
    inputs, _ = _batch(GRIDS + [(9, 1)], tokens=20)
    _, token_grid = NaFlexPatches(PATCH)(inputs["patches"],
                                                          inputs["spatial_shapes"])
    ours = as_numpy(posembed.resample_position_per_token(grid, token_grid, interpolation))
    source = torch.from_numpy(grid).permute(2, 0, 1)[None].double()
    for i, (h, w) in enumerate(inputs["spatial_shapes"].tolist()):
        # torch's antialiased kernels give every row one value where the output is a
        # single column wide (torch 2.13: its transpose disagrees); the transposed call
        # is the same resampling, which it computes right.
        transposed = w == 1 and h > 1
        expected = torch.nn.functional.interpolate(
            source.transpose(2, 3) if transposed else source,
            size=(w, h) if transposed else (h, w), **_TORCH_MODES[interpolation])
        expected = expected.transpose(2, 3) if transposed else expected
        expected = expected[0].permute(1, 2, 0).reshape(h * w, -1).numpy()
        np.testing.assert_allclose(ours[i, : h * w], expected, rtol=0, atol=2e-5)


# --- SigLIP 2 against HF ----------------------------------------------------------------


def test_hf_siglip2_directory_builds_a_naflex_model_equal_to_transformers(siglip2):
    directory, pooled, tokens = siglip2
    model = keras_vit.pretrained(directory)  # from config.json alone
    config = model.get_config()
    assert (config["naflex"], config["classifier"], config["pos_interpolation"],
            config["image_size"]) == (True, "map", "bilinear_antialias", (32, 32))
    assert config["preprocessing"]["interpolation"] == "bilinear"
    inputs, _ = _batch()
    ours_pooled, ours_tokens = (as_numpy(x) for x in _tokens_model(model)(inputs))
    assert relative_error([ours_pooled], [pooled]) < 1e-4
    assert relative_error([_real_tokens(ours_tokens, inputs)], [tokens]) < 1e-4


def test_hf_siglip2_model_directory_loads_its_vision_tower(tmp_path):
    text = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=32, vocab_size=64, max_position_embeddings=16)
    config = transformers.Siglip2Config(text_config=text, vision_config=HF_SIZES)
    hf = randomise(transformers.Siglip2Model(config), seed=5).eval()
    hf.save_pretrained(tmp_path)
    inputs, _ = _batch()
    expected = _hf(hf.get_image_features, inputs).pooler_output.numpy()
    model = keras_vit.pretrained(tmp_path)
    report = keras_vit.load_pretrained(model, tmp_path)
    assert any(m.startswith("the text tower's") for m in report.messages)
    assert relative_error([as_numpy(model(inputs))], [expected]) < 1e-4


def test_negative_control_padding_left_unmasked_misses_transformers(siglip2):
    """The comparison can fail: the padded tokens let into attention and the MAP head."""
    directory, pooled, _ = siglip2
    model = keras_vit.pretrained(directory)
    inputs, _ = _batch()
    unmasked = dict(inputs, patch_mask=np.ones_like(inputs["patch_mask"]))
    assert relative_error([as_numpy(model(unmasked))], [pooled]) > 1e-2


def test_negative_control_another_table_resampling_misses_transformers(siglip2):
    directory, pooled, _ = siglip2
    model = keras_vit.pretrained(directory, pos_interpolation="bicubic_antialias")
    inputs, _ = _batch()
    assert relative_error([as_numpy(model(inputs))], [pooled]) > 1e-3


def test_padding_changes_nothing_and_keras_files_round_trip(siglip2, tmp_path):
    """Each image's output is its own: alone and unpadded, or padded in the batch."""
    model = keras_vit.pretrained(siglip2[0])
    inputs, _ = _batch()
    batch = predicted(model, inputs)
    for i, (h, w) in enumerate(GRIDS):
        alone = {key: value[i : i + 1] for key, value in inputs.items()}
        alone["patches"], alone["patch_mask"] = (alone["patches"][:, : h * w],
                                                 alone["patch_mask"][:, : h * w])
        np.testing.assert_allclose(predicted(model, alone)[0], batch[i], rtol=0, atol=1e-5)
    assert_keras_file_round_trip(model, inputs, tmp_path / "naflex.keras")


# --- the other pooling and position embeddings, against the fixed-size model ------------


@pytest.mark.parametrize("overrides", [
    dict(classifier="map"),
    dict(classifier="gap"),
    dict(classifier="token", num_registers=2),
    dict(classifier="avg", fc_norm=True, pos_interpolation="bicubic_antialias"),
    dict(classifier="gap", pos_embedding="learned2d"),  # NaViT's factorised embeddings
    dict(classifier="gap", pos_embedding="sincos2d"),
    # EVA-02's rope, scaled to a reference grid, and DINOv3's (patch centres on [-1, 1]):
    # computed for each image's grid.
    dict(classifier="avg", fc_norm=True, mlp="swiglu", rope=True, rope_reference_grid=(4, 4)),
    dict(classifier="token", rope=dinov3.rope(), pos_embedding="none", num_registers=4,
         layer_scale_init=1e-5),
])
def test_each_image_equals_the_fixed_size_model_on_it_alone(overrides):
    """A NaFlex model on the padded batch gives each image what a `dynamic_image_size`
    model with the same weights gives on that image alone (its table resampled to the
    image's grid as a whole, by the separable resampling)."""
    arguments = {**TINY, "pos_interpolation": "bilinear_antialias", **overrides}
    model = keras_vit.ViT(**arguments)
    randomise_weights(model, seed=2)
    fixed = keras_vit.ViT(**dict(arguments, naflex=False, dynamic_image_size=True))
    fixed.set_weights(model.get_weights())
    inputs, images = _batch()
    batch = predicted(model, inputs)
    for i, image in enumerate(images):
        np.testing.assert_allclose(batch[i], predicted(fixed, image[None])[0], rtol=0, atol=2e-5)


def test_a_naflex_dinov3_equals_hfs_dinov3_on_each_image(tmp_path):
    """An HF DINOv3ViTModel directory built as a NaFlex model: each image's pooler
    output and patch tokens are HF's on that image alone (its rope on its own grid)."""
    config = transformers.DINOv3ViTConfig(
        hidden_size=WIDTH, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_register_tokens=4, image_size=4 * PATCH, patch_size=PATCH)
    hf = randomise(transformers.DINOv3ViTModel(config), seed=7).eval()
    hf.save_pretrained(tmp_path)
    model = keras_vit.pretrained(tmp_path, naflex=True, dynamic_image_size=False)
    inputs, images = _batch()
    pooled, tokens = (as_numpy(x) for x in _tokens_model(model)(inputs))
    for i, image in enumerate(images):
        with torch.no_grad():
            out = hf(torch.from_numpy(image.transpose(2, 0, 1)[None].copy()))
        count = int(inputs["patch_mask"][i].sum())
        assert relative_error([pooled[i], tokens[i, 5 : 5 + count]],
                              [out.pooler_output[0].numpy(),
                               out.last_hidden_state[0, 5:].numpy()]) < 1e-4


def test_under_mixed_bfloat16_the_padding_stays_out(siglip2):
    """The mask is added to float32 logits under every policy: bfloat16 outputs stay
    within a few percent of HF's float32 ones."""
    model = keras_vit.pretrained(siglip2[0], dtype="mixed_bfloat16")
    inputs, _ = _batch()
    ours = as_numpy(keras.ops.cast(model(inputs), "float32"))
    assert relative_error([ours], [siglip2[1]]) < 5e-2


def test_tokens_output_keeps_the_padding_out_of_the_real_tokens():
    model = keras_vit.ViT(**TINY, classifier="gap", pooling=False)
    randomise_weights(model, seed=4)
    inputs, _ = _batch()
    noisy = dict(inputs, patches=np.where(inputs["patch_mask"][..., None] == 1,
                                          inputs["patches"], 7.0).astype("float32"))
    np.testing.assert_allclose(_real_tokens(as_numpy(model(noisy)), inputs),
                               _real_tokens(as_numpy(model(inputs)), inputs), rtol=0, atol=1e-5)


@pytest.mark.parametrize("arguments, message", [
    (dict(dynamic_image_size=True), r"naflex=True takes patches already cut, but "
                                    r"dynamic_image_size=True takes images"),
    (dict(remat=True), r"but remat=True"),
])
def test_what_naflex_cannot_have_is_named(arguments, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT(**TINY, **arguments)


def test_patches_of_another_width_are_refused_naming_the_size():
    inputs, _ = _batch()
    with pytest.raises(ValueError, match=r"8x8 pixels and 3 channels are 192 values wide, "
                                         r"got shape \(5, 16, 96\)"):
        NaFlexPatches(PATCH)(inputs["patches"][..., :96], inputs["spatial_shapes"])


# --- the registry ------------------------------------------------------------------------


@pytest.mark.parametrize("name, width", [("siglip2-base-patch16-naflex", 768),
                                         ("siglip2-so400m-patch16-naflex", 1152)])
def test_registry_entries_of_the_released_naflex_checkpoints(name, width):
    entry = next(e for e in keras_vit.list_weights() if e.name == name)
    assert entry.url == f"https://huggingface.co/google/{name}/resolve/main/model.safetensors"
    architecture = Architecture(**entry.build_args())
    assert (architecture.naflex, architecture.patch_size, architecture.hidden_dim,
            architecture.grid_size) == (True, 16, width, (16, 16))
    assert entry.preprocessing == dict(mean=[0.5] * 3, std=[0.5] * 3, interpolation="bilinear",
                                       antialias=True, crop_fraction=None)


# --- naflex_inputs against HF's processor, on photos ------------------------------------


def _photos():
    """scikit-learn's two sample photos and crops of other aspect ratios."""
    from sklearn.datasets import load_sample_images

    china, flower = load_sample_images().images
    return [china, flower, china[50:300, 100:200], flower[:100], china[100:190, 20:420],
            flower[:17, :33]]


@pytest.mark.parametrize("max_num_patches", [256, 64])
def test_naflex_inputs_equal_the_siglip2_processor_on_photos(max_num_patches):
    photos = _photos()
    ours = keras_vit.naflex_inputs(photos, patch_size=16, max_num_patches=max_num_patches)
    processor = transformers.Siglip2ImageProcessorPil()
    reference = processor(photos, max_num_patches=max_num_patches, return_tensors="np")
    np.testing.assert_array_equal(ours["spatial_shapes"], reference["spatial_shapes"])
    np.testing.assert_array_equal(ours["patch_mask"], reference["pixel_attention_mask"])
    # The same 8-bit pixels, normalised in float32.
    np.testing.assert_allclose(ours["patches"], reference["pixel_values"], rtol=0, atol=1e-6)


def test_naflex_inputs_import_no_tensorflow():
    code = ("import sys, numpy as np, keras_vit; "
            "keras_vit.naflex_inputs([np.zeros((20, 30, 3), np.uint8)]); "
            "print('tensorflow' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[1],
                            env=clean_environment(KERAS_BACKEND="jax"))
    assert result.stdout.strip() == "False", result.stderr[-2000:]


def test_naflex_inputs_refuse_float_images_naming_them():
    with pytest.raises(ValueError, match=r"takes uint8 \(height, width, 1 or 3\) images, but "
                                         r"image 1 is float32 of shape \(20, 30, 3\)"):
        keras_vit.naflex_inputs([np.zeros((8, 8, 3), np.uint8), np.zeros((20, 30, 3), "float32")])


def test_naflex_inputs_refuse_another_resize():
    with pytest.raises(ValueError, match=r"but the preprocessing asks for "
                                         r"interpolation='bicubic', antialias=True"):
        keras_vit.naflex_inputs([np.zeros((20, 30, 3), np.uint8)],
                                preprocessing=dict(interpolation="bicubic"))
