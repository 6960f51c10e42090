"""A NaFlex model (`keras_vit.ViT(naflex=True)`) against timm's `NaFlexVit`, from the
outputs timm computed (tests/fixtures/naflexvit_timm/make.py; timm does not import in
this environment), on one batch of images of 3x5, 4x4, 2x7 and 1x1 patches padded to 18
tokens: a tiny random `naflexvit_base_patch16_siglip` (learned 4x4 position table
resampled bilinearly with antialias to each image's grid, MAP head, tanh GELU, 5
classes), loaded from its folder as timm's `save_for_hf` wrote it with no other
argument; a tiny random NaFlexVit made a DINOv3 (class token, 4 registers, DINOv3's
rope on each image's grid, layer scale) loaded into keras-vit's DINOv3 NaFlex model; and
one with EVA's axial rope scaled onto a 4x4 reference grid, loaded into keras-vit's EVA
rope NaFlex model.
"""

import json
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_vit
from family_contract import relative_error
from keras_vit.families import dinov3

FIXTURES = Path(__file__).parent / "fixtures" / "naflexvit_timm"
FOLDER = FIXTURES / "naflexvit_base_patch16_siglip"
SAVED = np.load(FIXTURES / "naflexvit_base_patch16_siglip_outputs.npz")
INPUTS = {key: SAVED[key] for key in ("patches", "patch_mask", "spatial_shapes")}
VALID = SAVED["patch_valid"]


def outputs(model, prefix=0):
    """The model's logits, its pooled features (the MAP head's output) and its final
    normed tokens at the `prefix` tokens and the real patches (padding differs: timm's
    padded queries attend to nothing)."""
    parts = keras_vit.vit_parts(model)
    pooled = model.get_layer("head").input if prefix == 0 else model.output
    probe = keras.Model(model.input, [model.output, pooled, parts.norm.output])
    logits, pooled, tokens = (keras.ops.convert_to_numpy(x) for x in probe(INPUTS))
    return [logits, pooled, tokens[real_tokens(prefix)]]


def real_tokens(prefix):
    """The mask of the prefix tokens and the real patches."""
    return np.concatenate([np.ones((len(VALID), prefix), bool), VALID], axis=1)


REFERENCE = [SAVED["logits"], SAVED["pooled"], SAVED["tokens"][VALID]]


def test_the_batch_is_timms_naflex_dict_in_keras_vits_form():
    """The fixture's keras-vit dict says what timm's does: each image's grid is its
    largest patch coordinate plus one, its real patches the valid ones."""
    coords, shapes = SAVED["patch_coord"], SAVED["spatial_shapes"]
    for b, (rows, cols) in enumerate(shapes):
        assert tuple(coords[b][VALID[b]].max(axis=0) + 1) == (rows, cols)
        assert VALID[b].sum() == rows * cols == SAVED["patch_mask"][b].sum()
    assert len({r / c for r, c in shapes}) == 3  # three aspect ratios


def test_timm_folder_builds_with_no_argument_and_equals_timm():
    """`keras_vit.pretrained(DIR)` of timm's NaFlexVit folder builds the NaFlex model from
    its config.json (the architecture, the model_args it was created with) and equals
    timm's logits, pooled features and final tokens at every real patch."""
    model = keras_vit.pretrained(str(FOLDER))
    config = model.get_config()
    assert config["naflex"] and config["pos_interpolation"] == "bilinear_antialias"
    assert (config["hidden_dim"], config["mlp_dim"], config["patch_size"]) == (32, 48, 4)
    assert (config["classifier"], config["num_classes"]) == ("map", 5)
    assert relative_error(outputs(model), REFERENCE) < 1e-5


def test_timm_state_dict_loads_with_nothing_missing_or_unexpected():
    model = keras_vit.ViT(
        image_size=16, patch_size=4, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=48,
        num_classes=5, classifier="map", gelu_approximate=True, naflex=True,
        pos_interpolation="bilinear_antialias",
    )
    report = keras_vit.load_pretrained(model, FOLDER / "model.safetensors")
    assert report.format == "timm" and not (report.missing or report.unexpected)
    assert relative_error(outputs(model), REFERENCE) < 1e-5


def test_negative_control_another_table_resampling_disagrees():
    """The table resampled bicubically instead (timm's ViT default) disagrees on every
    image but the 4x4 one, whose grid is the table's."""
    model = keras_vit.pretrained(str(FOLDER), pos_interpolation="bicubic_antialias")
    pooled = outputs(model)[1]
    for image in (0, 2, 3):
        assert relative_error([pooled[image]], [REFERENCE[1][image]]) > 1e-4, image
    assert relative_error([pooled[1]], [REFERENCE[1][1]]) < 1e-5


@pytest.mark.parametrize("key, value", [("class_token", True), ("global_pool", "avg"),
                                        ("pos_embed", "factorized")])
def test_a_model_arg_keras_vit_does_not_build_is_refused_naming_it(tmp_path, key, value):
    folder = tmp_path / "edited"
    shutil.copytree(FOLDER, folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_args"][key] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"{key}={value!r}"):
        keras_vit.pretrained(str(folder))


# ---------------------------------------------------------------------------
# timm's NaFlexVit made a DINOv3: its rope on each image's grid.

DINOV3 = FIXTURES / "naflexvit_dinov3_rope"


def dinov3_model():
    """keras-vit's DINOv3 NaFlex model of the fixture's sizes (timm's LayerNorm epsilon)
    with timm's weights loaded, and the load report."""
    model = keras_vit.ViT(
        image_size=16, patch_size=4, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=48,
        **dict(dinov3.SWITCHES, dynamic_image_size=False, layer_norm_epsilon=1e-6),
        naflex=True,
    )
    return model, keras_vit.load_pretrained(model, DINOV3 / "model.safetensors")


def dinov3_reference():
    saved = np.load(FIXTURES / "naflexvit_dinov3_rope_outputs.npz")
    return [saved["pooled"], saved["tokens"][real_tokens(5)]]


def test_timm_naflexvit_with_dinov3s_rope_equals_timm():
    """timm's NaFlexVit with `rope_type="dinov3"` (per image, the rope of its own grid:
    patch centres on [-1, 1]) is keras-vit's DINOv3 NaFlex model: its state dict loads
    with nothing missing or unexpected (the rope read from the file), and the pooled
    class token and every real token (class, registers, patches) equal timm's."""
    model, report = dinov3_model()
    assert report.format == "timm" and not (report.missing or report.unexpected)
    assert relative_error(outputs(model, prefix=5)[1:], dinov3_reference()) < 1e-5


def test_negative_control_without_the_rotate_half_channel_order_timm_disagrees(monkeypatch):
    from keras_vit.weights import formats

    monkeypatch.setattr(formats, "rotate_half_order", np.arange)
    model, _ = dinov3_model()
    assert relative_error(outputs(model, prefix=5)[1:], dinov3_reference()) > 1e-2


# ---------------------------------------------------------------------------
# timm's NaFlexVit with EVA's axial rope: EVA-02's, scaled to a reference grid.


def test_timm_naflexvit_with_evas_axial_rope_equals_timm():
    """timm's NaFlexVit with `rope_type="axial"` and `rope_ref_feat_shape=(4, 4)` (per
    image, its own grid's indices scaled onto 4x4) is keras-vit's EVA rope NaFlex model
    (`rope=True, rope_reference_grid=(4, 4)`; its class token, layer scales `gamma_1`,
    `gamma_2` and `fc_norm` loaded by their timm names): the pooled patch mean and the
    last block's real tokens equal timm's."""
    saved = np.load(FIXTURES / "naflexvit_eva_rope_outputs.npz")
    model = keras_vit.ViT(
        image_size=16, patch_size=4, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=48,
        classifier="avg", fc_norm=True, rope=True, rope_reference_grid=(4, 4),
        pos_embedding="none", layer_scale_init=1e-5, naflex=True, include_top=False,
    )
    report = keras_vit.load_pretrained(model, FIXTURES / "naflexvit_eva_rope" / "model.safetensors")
    assert report.format == "timm" and not (report.missing or report.unexpected)
    probe = keras.Model(model.input, [model.output, keras_vit.vit_parts(model).blocks[-1].output])
    pooled, tokens = (keras.ops.convert_to_numpy(x) for x in probe(INPUTS))
    reference = [saved["pooled"], saved["tokens"][real_tokens(1)]]
    assert relative_error([pooled, tokens[real_tokens(1)]], reference) < 1e-5
    # Its rope without the reference grid (the raw indices) disagrees.
    unscaled = keras_vit.ViT(**dict(model.get_config(), rope_reference_grid=None))
    unscaled.set_weights(model.get_weights())
    assert relative_error([keras.ops.convert_to_numpy(unscaled(INPUTS))], reference[:1]) > 1e-3
