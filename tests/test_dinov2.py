"""Registers and DINOv2 on the one `keras_vit.ViT`: numerics against HF transformers,
on every Keras backend.

The references are tiny randomly initialised HF `Dinov2Model` (with and without the
SwiGLU MLP) and `Dinov2WithRegistersModel` saved with `save_pretrained` (nothing
downloads). Each comparison takes `pooler_output`, `last_hidden_state` and every
block's output tokens, within 1e-4 of their largest magnitude, in float32; at other
resolutions against HF's `interpolate_pos_encoding`. The module runs on the current
backend; tests/test_backends_*.py runs it on the others.
"""

import json

import keras
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import (
    Dinov2Config,
    Dinov2ForImageClassification,
    Dinov2Model,
    Dinov2WithRegistersConfig,
    Dinov2WithRegistersForImageClassification,
    Dinov2WithRegistersModel,
)

import keras_vit
from family_contract import (
    as_numpy, assert_maps_leave_out_prefix, check_family_contract, fine_tune, outputs,
    relative_error,
)
from references import randomise

LAYERS, WIDTH, HEADS, SIZE, PATCH = 2, 32, 4, 28, 7
HF_CONFIG = dict(hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                 image_size=SIZE, patch_size=PATCH)
# Kinds of reference: (model class, config class, config switches).
KINDS = {
    "dinov2": (Dinov2Model, Dinov2Config, {}),
    "swiglu": (Dinov2Model, Dinov2Config, dict(use_swiglu_ffn=True)),
    "registers": (Dinov2WithRegistersModel, Dinov2WithRegistersConfig, {}),
}
# HF's image processor for the DINOv2 checkpoints (BitImageProcessor).
PROCESSOR = dict(
    image_processor_type="BitImageProcessor", do_resize=True, size={"shortest_edge": 256},
    resample=3, do_center_crop=True, crop_size={"height": 224, "width": 224},
    do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
    image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225],
)


def images(height=SIZE, width=SIZE, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (3, height, width, 3)).astype("float32")


def hf_outputs(hf, pixels):
    with torch.no_grad():
        out = hf(pixel_values=torch.from_numpy(pixels.transpose(0, 3, 1, 2)),
                 output_hidden_states=True)
    # hidden_states: the embeddings, then each block's output (before the final norm).
    return [out.pooler_output.numpy(), out.last_hidden_state.numpy(),
            *(h.numpy() for h in out.hidden_states[1:])]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Each kind's saved directory and HF model."""
    made = {}
    for seed, (kind, (model_class, config_class, switches)) in enumerate(KINDS.items()):
        directory = tmp_path_factory.mktemp(kind)
        hf = randomise(model_class(config_class(**HF_CONFIG, **switches)), seed=seed)
        hf.save_pretrained(directory)
        (directory / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
        made[kind] = directory, hf
    return made


@pytest.mark.parametrize("kind", KINDS)
def test_hf_directory_builds_and_matches_transformers(kind, references):
    directory, hf = references[kind]
    model = keras_vit.pretrained(directory)  # from config.json: no constructor arguments
    config = model.get_config()
    assert (config["layer_scale_init"], config["dynamic_image_size"]) == (1.0, True)
    assert config.get("num_registers", 0) == (4 if kind == "registers" else 0)
    assert config.get("mlp", "gelu") == ("swiglu" if kind == "swiglu" else "gelu")
    assert config["preprocessing"] == dict(
        mean=PROCESSOR["image_mean"], std=PROCESSOR["image_std"], interpolation="bicubic",
        antialias=True, crop_fraction=224 / 256,
    )
    ours = outputs(model, images(), final_norm=True)
    assert relative_error(ours, hf_outputs(hf, images())) < 1e-4


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("height, width", [(42, 42), (21, 35)])
def test_other_resolutions_match_interpolate_pos_encoding(kind, height, width, references):
    """HF resamples its 4x4 table bicubically (antialiased with registers) to each
    input's grid; so does the dynamic model, in its graph."""
    directory, hf = references[kind]
    model = keras_vit.pretrained(directory)
    pixels = images(height, width, seed=1)
    assert relative_error(outputs(model, pixels, final_norm=True), hf_outputs(hf, pixels)) < 1e-4


def test_a_fixed_size_model_loaded_with_hfs_interpolation_matches(references):
    directory, hf = references["dinov2"]
    model = keras_vit.ViT(weights=directory, image_size=42, include_top=False)
    keras_vit.load_pretrained(model, directory, interpolation="bicubic")
    pixels = images(42, 42, seed=1)
    assert relative_error(outputs(model, pixels, final_norm=True), hf_outputs(hf, pixels)) < 1e-4


def test_hf_vit_interpolate_pos_encoding_is_the_bicubic_option(tmp_path):
    """HF's ViT (and DeiT) resample as its Dinov2Model does: `pos_interpolation="bicubic"`
    equals `interpolate_pos_encoding=True`."""
    from transformers import ViTConfig, ViTModel

    hf = randomise(ViTModel(ViTConfig(**HF_CONFIG, intermediate_size=64, layer_norm_eps=1e-6)),
                   seed=7)
    hf.save_pretrained(tmp_path)
    model = keras_vit.pretrained(tmp_path, dynamic_image_size=True, pos_interpolation="bicubic")
    pixels = images(21, 42, seed=2)
    with torch.no_grad():
        expected = hf(pixel_values=torch.from_numpy(pixels.transpose(0, 3, 1, 2)),
                      interpolate_pos_encoding=True).pooler_output.numpy()
    assert relative_error([as_numpy(model(pixels))], [expected]) < 1e-4


def test_negative_control_timms_antialiased_resampling_misses_dinov2(references):
    """The comparison can fail: DINOv2 at 42 px with timm's antialiased bicubic (a = -0.5)
    instead of HF's plain bicubic (a = -0.75) misses every output, though it matches at
    the trained size."""
    directory, hf = references["dinov2"]
    model = keras_vit.pretrained(directory, pos_interpolation="bicubic_antialias")
    ours = outputs(model, images(), final_norm=True)
    assert relative_error(ours, hf_outputs(hf, images())) < 1e-4
    pixels = images(42, 42, seed=1)
    assert relative_error(outputs(model, pixels, final_norm=True), hf_outputs(hf, pixels)) > 1e-3


def test_negative_control_registers_left_out_miss_the_reference(references):
    directory, hf = references["registers"]
    arguments = dict(image_size=SIZE, patch_size=PATCH, hidden_dim=WIDTH, num_layers=LAYERS,
                     num_heads=HEADS, mlp_dim=4 * WIDTH, layer_scale_init=1.0, include_top=False)
    model = keras_vit.ViT(**arguments)
    with pytest.raises(ValueError, match=r"has 4 register tokens 'reg', but the model has none: "
                       r"build the model with num_registers=4"):
        keras_vit.load_pretrained(model, directory)
    report = keras_vit.load_pretrained(model, directory, strict=False)
    assert report.unexpected == ["reg"]
    pooled = as_numpy(model(images()))  # the tokens are 4 fewer: compare pooler_output
    assert relative_error([pooled], hf_outputs(hf, images())[:1]) > 1e-2
    with pytest.raises(ValueError, match=r"has no register tokens 'reg', but the model has it: "
                       r"build the model with num_registers=0"):
        keras_vit.load_pretrained(keras_vit.ViT(**arguments, num_registers=4),
                                  references["dinov2"][0])


@pytest.mark.parametrize("model_class, config_class", [
    (Dinov2ForImageClassification, Dinov2Config),
    (Dinov2WithRegistersForImageClassification, Dinov2WithRegistersConfig),
])
def test_hf_image_classification_matches_its_logits(model_class, config_class, tmp_path):
    """`Dinov2*ForImageClassification`: the head reads the class token and the mean of
    the patch tokens (registers left out), `classifier="token_gap"`."""
    hf = randomise(model_class(config_class(**HF_CONFIG, num_labels=5)), seed=5)
    hf.save_pretrained(tmp_path)
    model = keras_vit.pretrained(tmp_path)
    assert model.get_config()["classifier"] == "token_gap"
    for pixels in (images(), images(42, 35, seed=3)):
        with torch.no_grad():
            logits = hf(pixel_values=torch.from_numpy(pixels.transpose(0, 3, 1, 2))).logits
        assert relative_error([as_numpy(model(pixels))], [logits.numpy()]) < 1e-4
    if model_class is Dinov2WithRegistersForImageClassification:
        # Negative control: the registers counted as patches in the mean miss the logits.
        parts = keras_vit.vit_parts(model)
        tokens = keras.Model(model.input, parts.norm.output)(images())
        pooled = keras_vit.TokenPooling("token_gap", index=1)(tokens)
        with torch.no_grad():
            logits = hf(pixel_values=torch.from_numpy(images().transpose(0, 3, 1, 2))).logits
        assert relative_error([as_numpy(parts.head(pooled))], [logits.numpy()]) > 1e-2


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="exported from TensorFlow or JAX")
def test_saved_model_export_serves_a_dinov2_classifier_at_any_size(tmp_path):
    """A registers classifier exported with `native_resolution` serves each size as the
    Keras model computes it (HF's `interpolate_pos_encoding` inside the SavedModel)."""
    import tensorflow as tf

    hf = randomise(Dinov2WithRegistersForImageClassification(
        Dinov2WithRegistersConfig(**HF_CONFIG, num_labels=3, use_swiglu_ffn=True)), seed=6)
    hf.save_pretrained(tmp_path / "hf")
    model = keras_vit.pretrained(tmp_path / "hf")
    keras_vit.export_saved_model(model, tmp_path / "export", native_resolution=True)
    served = tf.saved_model.load(str(tmp_path / "export")).signatures["logits"]
    pixels = np.random.default_rng(4).uniform(0, 255, (2, 42, 35, 3)).astype("float32")
    expected = as_numpy(model(keras_vit.preprocess(pixels)))
    np.testing.assert_allclose(served(images=tf.constant(pixels))["logits"].numpy(), expected,
                               rtol=0, atol=1e-5 * np.abs(expected).max())


def test_a_swiglu_checkpoint_into_a_gelu_model_names_the_switch(references):
    model = keras_vit.ViT(image_size=SIZE, patch_size=PATCH, hidden_dim=WIDTH,
                          num_layers=LAYERS, num_heads=HEADS, mlp_dim=88,
                          layer_scale_init=1.0, include_top=False)
    with pytest.raises(ValueError, match=r"has a SwiGLU MLP \(DINOv2 giant\), but the model has "
                       r"none: build the model with mlp='swiglu'"):
        keras_vit.load_pretrained(model, references["swiglu"][0])


def timm_from_hf(files, registers):
    """HF DINOv2 tensors -> timm's state dict, as timm's `_convert_dinov2` writes it: the
    registers' model with `no_embed_class` (the class token's position row folded into
    the token, the table of the patches only)."""
    w = {key: value for key, value in files.items() if key != "embeddings.mask_token"}
    table = w.pop("embeddings.position_embeddings")
    state = {"cls_token": w.pop("embeddings.cls_token"), "pos_embed": table}
    if registers:
        state["reg_token"] = w.pop("embeddings.register_tokens")
        state["cls_token"] = state["cls_token"] + table[:, :1]
        state["pos_embed"] = table[:, 1:]
    for p in ("weight", "bias"):
        state[f"patch_embed.proj.{p}"] = w.pop(f"embeddings.patch_embeddings.projection.{p}")
        state[f"norm.{p}"] = w.pop(f"layernorm.{p}")
        for i in range(LAYERS):
            hf, timm = f"encoder.layer.{i}.", f"blocks.{i}."
            state[f"{timm}attn.qkv.{p}"] = np.concatenate(
                [w.pop(f"{hf}attention.attention.{n}.{p}") for n in ("query", "key", "value")])
            for ours, theirs in (("attn.proj", "attention.output.dense"), ("norm1", "norm1"),
                                 ("norm2", "norm2"), ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")):
                state[f"{timm}{ours}.{p}"] = w.pop(f"{hf}{theirs}.{p}")
    for i in range(LAYERS):
        for n in (1, 2):
            state[f"blocks.{i}.ls{n}.gamma"] = w.pop(f"encoder.layer.{i}.layer_scale{n}.lambda1")
    assert not w, sorted(w)
    return state


@pytest.mark.parametrize("kind", ["dinov2", "registers"])
def test_timm_files_load_with_the_registry_switches(kind, references, tmp_path):
    """timm's copies (the registry's files) hold the registers' model with
    no_embed_class: built with the registry entry's switches it equals HF's."""
    from keras_vit.weights import registry

    directory, hf = references[kind]
    path = tmp_path / "timm.safetensors"
    save_file(timm_from_hf(load_file(directory / "model.safetensors"), kind == "registers"), path)
    entry = registry.get_weights(f"vit_small_patch14{'_reg4' if kind == 'registers' else ''}"
                                 "_dinov2.lvd142m")
    switches = {k: v for k, v in entry.model_args.items() if k != "layer_scale_init"}
    model = keras_vit.ViT(image_size=SIZE, patch_size=PATCH, hidden_dim=WIDTH,
                          num_layers=LAYERS, num_heads=HEADS, mlp_dim=4 * WIDTH,
                          layer_scale_init=1e-5, **switches)
    report = keras_vit.load_pretrained(model, path)
    assert report.format == "timm"
    found = outputs(model, images(), final_norm=True)
    assert relative_error(found, hf_outputs(hf, images())) < 1e-4


# --- every keras-vit feature, with registers ------------------------------------------


def test_feature_maps_and_attention_maps_leave_the_registers_out(references):
    directory, _ = references["registers"]
    model = keras_vit.pretrained(directory)
    pixels = images()
    parts = keras_vit.vit_parts(model)
    assert parts.num_prefix_tokens == 5  # the class token and 4 registers
    attentions = assert_maps_leave_out_prefix(model, pixels, outputs(model, pixels)[-1], 5, 5)
    with pytest.raises(ValueError, match=r"21 tokens do not fit grid_size \(4, 4\): expected 16"):
        keras_vit.attention_map(attentions[-1][:, 0], (4, 4))  # not told from the count
    distance = keras_vit.mean_attention_distance(attentions, (4, 4), PATCH, prefix_tokens=5)
    assert distance.shape == (LAYERS, HEADS)


def test_fine_tuning_from_a_dinov2_directory_adds_a_zero_head(references):
    """ViT(weights=HF_DIR, num_classes=...) takes the architecture from config.json; the
    headless backbone gets a new zero head."""
    directory, hf = references["registers"]
    model = keras_vit.ViT(weights=directory, num_classes=5, image_size=42)
    config = model.get_config()
    assert (config["num_registers"], config["layer_scale_init"], config["num_classes"]) == (4, 1.0, 5)
    head = keras_vit.vit_parts(model).head
    assert not np.any(as_numpy(head.kernel)) and tuple(head.kernel.shape) == (WIDTH, 5)
    assert tuple(model(images(42, 42)).shape) == (3, 5)


@pytest.mark.slow
def test_engine_fine_tuning_from_a_registers_backbone_adds_a_zero_head(references, tmp_path,
                                                                      caplog):
    arch = dict(patch_size=PATCH, hidden_dim=WIDTH, num_layers=LAYERS, num_heads=HEADS,
                mlp_dim=4 * WIDTH, layer_scale_init=1.0, num_registers=4)
    result = fine_tune(references["registers"][0], arch, 14, tmp_path / "run", caplog)
    assert "the checkpoint has no head: the head is reset to zeros." in caplog.text
    parts = keras_vit.vit_parts(result.model)
    assert parts.registers.num_tokens == 4 and tuple(parts.head.kernel.shape) == (WIDTH, 5)
    # The weights' own preprocessing (preprocessor_config.json), recorded by the run.
    assert result.model.get_config()["preprocessing"]["mean"] == PROCESSOR["image_mean"]


@pytest.mark.parametrize("kind", ["dinov2", "registers"])
def test_vit_weights_of_a_backbone_without_num_classes_is_the_backbone(kind, references):
    """ViT(weights=DIR) of a headless source, no num_classes: the model pretrained(DIR)
    builds, whose output is HF's pooler_output (it asked for num_classes; a49e3a4 built a
    zero 1000-class head), at another size too (the position table resampled)."""
    directory, hf = references[kind]
    model = keras_vit.ViT(weights=directory)
    assert keras_vit.vit_parts(model).head is None
    assert model.get_config() == keras_vit.pretrained(directory).get_config()
    ours = outputs(model, images(), final_norm=True)
    assert relative_error(ours, hf_outputs(hf, images())) < 1e-4


FAMILY = {
    "registers": dict(num_registers=4),
    "swiglu": dict(mlp="swiglu", layer_scale_init=1e-5),
    "classifier": dict(classifier="token_gap", num_registers=4),
    "dinov2": dict(num_registers=2, mlp="swiglu", layer_scale_init=0.1, no_embed_class=True,
                   dynamic_image_size=True, pos_interpolation="bicubic"),
}


@pytest.mark.parametrize("name", FAMILY)
def test_family_contract(name, tmp_path):
    check_family_contract(FAMILY[name], tmp_path)


@pytest.mark.parametrize("arguments, message", [
    (dict(num_registers=-1), "num_registers must be a whole number, 0 or more, got -1"),
    (dict(num_registers=4, classifier="gap"), "num_registers=4 .* classifier='gap' has none"),
    (dict(mlp="relu"), "mlp.*'relu'"),
    (dict(pos_interpolation="cubic"), "pos_interpolation.*'cubic'"),
])
def test_bad_switches_are_named(arguments, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT(image_size=SIZE, patch_size=PATCH, hidden_dim=WIDTH, num_layers=1,
                      num_heads=HEADS, mlp_dim=48, **arguments)


def test_registry_lists_the_dinov2_backbones_with_their_switches():
    from keras_vit.weights.pretrained import source_defaults

    entries = {e.name: e for e in keras_vit.list_weights("dinov2")}
    assert len(entries) == 8
    giant = entries["vit_giant_patch14_reg4_dinov2.lvd142m"]
    assert (giant.image_size, giant.model_args["mlp"], giant.model_args["num_registers"],
            giant.model_args["mlp_dim"]) == (518, "swiglu", 4, 4096)
    assert entries["vit_base_patch14_dinov2.lvd142m"].preprocessing == dict(
        mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], interpolation="bicubic",
        antialias=True, crop_fraction=1.0)
    name = "vit_small_patch14_reg4_dinov2.lvd142m"
    assert source_defaults(name, {"image_size": 224, "include_top": False}) == dict(
        variant="S/14", image_size=224, include_top=False, num_classes=0, layer_scale_init=1e-5,
        num_registers=4, no_embed_class=True,
    )
    # Without num_classes nor include_top: the backbone as released, as timm builds it
    # (num_classes=0); include_top=True still needs the classes.
    assert source_defaults(name, {"image_size": 224}) == dict(
        keras_vit.weights.registry.get_weights(name).build_args(), image_size=224)
    with pytest.raises(ValueError, match=f"weights='{name}' are an image tower without classes"):
        source_defaults(name, {"image_size": 224, "include_top": True})
