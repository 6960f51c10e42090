"""SigLIP and CLIP vision towers on the one `keras_vit.ViT`: numerics against HF
transformers, on every Keras backend.

The references are tiny randomly initialised HF `SiglipVisionModel`,
`CLIPVisionModelWithProjection` and `CLIPVisionModel` models (and full `SiglipModel` /
`CLIPModel`s) saved with `save_pretrained` (nothing downloads). Each comparison takes
the output (`pooler_output`, `image_embeds`) and every block's output tokens, within
1e-4 of their largest magnitude, in float32. The module runs on the current backend;
tests/test_backends_*.py runs it on the others.
"""

import os

import keras
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
import transformers

import keras_vit
from helpers import assert_keras_file_round_trip, randomise_weights
from family_contract import IMAGES, as_numpy, check_family_contract, outputs, relative_error
from references import randomise

WIDTH, PROJECTION = 32, 24
HF_SIZES = dict(hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, image_size=32, patch_size=8)
TINY = dict(image_size=32, patch_size=8, hidden_dim=WIDTH, num_layers=2, num_heads=4,
            mlp_dim=64, include_top=False)
# The switches each family's HF config gives (SigLIP: tanh GELU, eps 1e-6, the default;
# CLIP: eps 1e-5).
SIGLIP = dict(classifier="map", gelu_approximate=True)
CLIP = dict(pre_norm=True, quick_gelu=True, patch_bias=False, layer_norm_epsilon=1e-5)
OPENAI_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_STD = [0.26862954, 0.26130258, 0.27577711]


def pixels(images=IMAGES):
    return torch.from_numpy(images.transpose(0, 3, 1, 2))


def save_reference(model, processor, directory, output):
    """Saves a randomised HF model (and its image processor) in `directory`; returns
    its `output` and each block's output tokens on `IMAGES`."""
    model = randomise(model, seed=3)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    with torch.no_grad():
        out = model(pixel_values=pixels(), output_hidden_states=True)
    # hidden_states: the embeddings (CLIP: after pre_layrnorm), then each block's output.
    return [getattr(out, output).numpy(), *(h.numpy() for h in out.hidden_states[1:])]


@pytest.fixture(scope="module")
def siglip(tmp_path_factory):
    directory = tmp_path_factory.mktemp("siglip")
    model = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**HF_SIZES))
    processor = transformers.SiglipImageProcessorPil()
    return directory, save_reference(model, processor, directory, "pooler_output")


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    directory = tmp_path_factory.mktemp("clip")
    config = transformers.CLIPVisionConfig(**HF_SIZES, projection_dim=PROJECTION)
    model = transformers.CLIPVisionModelWithProjection(config)
    processor = transformers.CLIPImageProcessorPil()
    return directory, save_reference(model, processor, directory, "image_embeds")


def test_hf_siglip_vision_model_builds_and_matches_transformers(siglip):
    directory, reference = siglip
    model = keras_vit.pretrained(directory)  # from config.json: no constructor arguments
    config = model.get_config()
    assert {key: config[key] for key in SIGLIP} == SIGLIP
    assert "cls" not in str([w.path for w in model.weights])  # no class token
    assert config["preprocessing"] == dict(mean=[0.5] * 3, std=[0.5] * 3,
                                           interpolation="bicubic", antialias=True,
                                           crop_fraction=None)
    assert model.output_shape == (None, WIDTH)
    assert relative_error(outputs(model), reference) < 1e-4


def test_hf_clip_with_projection_builds_and_matches_image_embeds(clip):
    directory, reference = clip
    model = keras_vit.pretrained(directory)
    config = model.get_config()
    assert {key: config[key] for key in CLIP} == CLIP
    assert config["projection_dim"] == PROJECTION and config["classifier"] == "token"
    assert config["preprocessing"] == dict(mean=OPENAI_MEAN, std=OPENAI_STD,
                                           interpolation="bicubic", antialias=True,
                                           crop_fraction=1.0)
    assert relative_error(outputs(model), reference) < 1e-4


def test_hf_clip_vision_model_outputs_its_pooler_output(tmp_path):
    config = transformers.CLIPVisionConfig(**HF_SIZES)
    reference = save_reference(transformers.CLIPVisionModel(config),
                               transformers.CLIPImageProcessorPil(), tmp_path, "pooler_output")
    model = keras_vit.pretrained(tmp_path)
    assert "projection_dim" not in model.get_config()
    assert relative_error(outputs(model), reference) < 1e-4


def test_a_siglip_without_its_head_outputs_the_tokens(tmp_path):
    """vision_use_head=false: HF's pooler_output is None; the model gives last_hidden_state."""
    config = transformers.SiglipVisionConfig(**HF_SIZES, vision_use_head=False)
    hf = randomise(transformers.SiglipVisionModel(config), seed=6)
    hf.save_pretrained(tmp_path)
    with torch.no_grad():
        expected = hf(pixel_values=pixels()).last_hidden_state.numpy()
    model = keras_vit.pretrained(tmp_path)
    assert model.get_config()["pooling"] is False
    assert relative_error([as_numpy(model(IMAGES))], [expected]) < 1e-4


@pytest.mark.parametrize("family", ["Siglip", "CLIP"])
def test_a_full_image_text_model_directory_loads_its_vision_tower(family, tmp_path):
    """SiglipModel / CLIPModel: the vision_config builds the tower, the text tower is left
    out with a note, and the output is the model's image features."""
    text = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=32, vocab_size=64, max_position_embeddings=16)
    vision = dict(HF_SIZES)
    if family == "Siglip":
        config = transformers.SiglipConfig(text_config=text, vision_config=vision)
    else:
        config = transformers.CLIPConfig(text_config=text, vision_config=vision,
                                         projection_dim=PROJECTION)
    hf = randomise(getattr(transformers, f"{family}Model")(config), seed=5)
    hf.save_pretrained(tmp_path)
    with torch.no_grad():
        expected = hf.get_image_features(pixel_values=pixels())
    expected = getattr(expected, "pooler_output", expected).numpy()
    model = keras_vit.pretrained(tmp_path)
    report = keras_vit.load_pretrained(model, tmp_path)
    assert any(m.startswith("the text tower's") for m in report.messages)
    assert relative_error([as_numpy(model(IMAGES))], [expected]) < 1e-4


# --- negative controls: one switch flipped ---------------------------------------------


def test_negative_control_siglip_pooled_by_mean_misses_transformers(siglip):
    """The comparison can fail: the same encoder pooled by the mean of its tokens
    (classifier='gap', the MAP head left out) misses HF's pooler_output."""
    directory, reference = siglip
    gap = keras_vit.ViT(**TINY, **{**SIGLIP, "classifier": "gap"})
    with pytest.raises(ValueError, match=r"classifier='map' model .*with a MAP head.*"
                       r"build it with classifier='map'"):
        keras_vit.load_pretrained(gap, directory)
    report = keras_vit.load_pretrained(gap, directory, strict=False)
    assert "MAPHead_0/probe" in report.unexpected
    ours = outputs(gap)
    assert relative_error(ours[1:], reference[1:]) < 1e-4  # the same encoder
    assert relative_error(ours[:1], reference[:1]) > 1e-2  # not its pooling


def test_negative_control_clip_without_quick_gelu_misses_transformers(clip):
    """The same tensors with GELU for quick GELU: the blocks and the embeddings miss HF's
    by far more than the tolerance (quick GELU is within 0.02 of GELU)."""
    directory, reference = clip
    gelu = keras_vit.ViT(**TINY, **{**CLIP, "quick_gelu": False}, projection_dim=PROJECTION)
    keras_vit.load_pretrained(gelu, directory)  # the same tensors: only numbers tell
    ours = outputs(gelu)
    for mine, theirs in zip(ours, reference):
        assert relative_error([mine], [theirs]) > 1e-3


@pytest.mark.parametrize("flipped, message", [
    (dict(pre_norm=False), r"has pre_norm LayerNorm \(CLIP's, before the blocks\), but the "
                           r"model has none: build the model with pre_norm=True"),
    (dict(patch_bias=True), r"has no patch-embedding bias, but the model has it: build the "
                            r"model with patch_bias=False"),
])
def test_a_clip_checkpoint_names_the_switch_a_model_lacks(clip, flipped, message):
    model = keras_vit.ViT(**TINY, **{**CLIP, **flipped}, projection_dim=PROJECTION)
    with pytest.raises(ValueError, match=message):
        keras_vit.load_pretrained(model, clip[0])


# --- timm's layouts of the same towers ---------------------------------------------------


def timm_blocks(files, p):
    """The blocks' `p` ("weight" or "bias") tensors of an HF SigLIP / CLIP encoder under
    timm's names (a fused q|k|v)."""
    state = {}
    for i in range(HF_SIZES["num_hidden_layers"]):
        hf, timm = f"encoder.layers.{i}.", f"blocks.{i}."
        state[f"{timm}attn.qkv.{p}"] = np.concatenate(
            [files[f"{hf}self_attn.{n}_proj.{p}"] for n in "qkv"])
        for t, h in (("norm1", "layer_norm1"), ("norm2", "layer_norm2"),
                     ("attn.proj", "self_attn.out_proj"), ("mlp.fc1", "mlp.fc1"),
                     ("mlp.fc2", "mlp.fc2")):
            state[f"{timm}{t}.{p}"] = files[f"{hf}{h}.{p}"]
    return state


def timm_siglip(files):
    """HF SiglipVisionModel tensors -> timm's `vit_*_siglip_*` state dict (its
    `attn_pool`: the latent, q, a fused k|v)."""
    state = {
        "patch_embed.proj.weight": files["embeddings.patch_embedding.weight"],
        "patch_embed.proj.bias": files["embeddings.patch_embedding.bias"],
        "pos_embed": files["embeddings.position_embedding.weight"][None],
        "attn_pool.latent": files["head.probe"],
    }
    width = state["pos_embed"].shape[-1]
    for p in ("weight", "bias"):
        state[f"norm.{p}"] = files[f"post_layernorm.{p}"]
        fused = files[f"head.attention.in_proj_{p}"]
        state[f"attn_pool.q.{p}"], state[f"attn_pool.kv.{p}"] = fused[:width], fused[width:]
        for timm, hf in (("proj", "attention.out_proj"), ("norm", "layernorm"),
                         ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")):
            state[f"attn_pool.{timm}.{p}"] = files[f"head.{hf}.{p}"]
        state.update(timm_blocks(files, p))
    return state


def timm_clip(files):
    """HF CLIPVisionModelWithProjection tensors -> timm's `vit_*_clip_*` state dict, as
    timm's `_convert_openai_clip` writes it: the projection as a head with a zero bias."""
    files = {k.removeprefix("vision_model."): v for k, v in files.items()}
    state = {
        "cls_token": files["embeddings.class_embedding"][None, None],
        "pos_embed": files["embeddings.position_embedding.weight"][None],
        "patch_embed.proj.weight": files["embeddings.patch_embedding.weight"],
        "head.weight": files["visual_projection.weight"],
        "head.bias": np.zeros(PROJECTION, "float32"),
    }
    for p in ("weight", "bias"):
        state[f"norm_pre.{p}"] = files[f"pre_layrnorm.{p}"]
        state[f"norm.{p}"] = files[f"post_layernorm.{p}"]
        state.update(timm_blocks(files, p))
    return state


@pytest.mark.parametrize("family", ["siglip", "clip"])
def test_timm_safetensors_match_transformers(family, siglip, clip, tmp_path):
    """timm's SigLIP (`attn_pool`) and CLIP (`norm_pre`, the projection as a zero-bias
    head) layouts of the same tensors give HF's outputs."""
    directory, reference = siglip if family == "siglip" else clip
    convert, switches, messages = {
        "siglip": (timm_siglip, SIGLIP, []),
        "clip": (timm_clip, dict(CLIP, projection_dim=PROJECTION),
                 ["timm's CLIP head without a bias is the image projection (projection_dim)."]),
    }[family]
    save_file(convert(load_file(directory / "model.safetensors")), tmp_path / "t.safetensors")
    model = keras_vit.ViT(**TINY, **switches)
    report = keras_vit.load_pretrained(model, tmp_path / "t.safetensors")
    assert report.format == "timm" and report.messages == messages
    assert relative_error(outputs(model), reference) < 1e-4


def big_vision_siglip(files, prefix):
    """HF SiglipVisionModel tensors -> the official big_vision SigLIP `.npz` layout: the
    inverse of transformers' `convert_siglip_to_hf.py` (`create_rename_keys`,
    `rename_key`, `read_in_q_k_v_head`), with a text tower and the contrastive scalars
    beside the image tower."""
    width, heads = WIDTH, HF_SIZES["num_attention_heads"]

    def qkv(kernel):  # torch (out, in) -> Flax DenseGeneral (D, heads, head_dim)
        return kernel.T.reshape(width, heads, -1)

    img = {
        "embedding/kernel": files["embeddings.patch_embedding.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": files["embeddings.patch_embedding.bias"],
        "pos_embedding": files["embeddings.position_embedding.weight"][None],
        "Transformer/encoder_norm/scale": files["post_layernorm.weight"],
        "Transformer/encoder_norm/bias": files["post_layernorm.bias"],
        "MAPHead_0/probe": files["head.probe"],
        "MAPHead_0/LayerNorm_0/scale": files["head.layernorm.weight"],
        "MAPHead_0/LayerNorm_0/bias": files["head.layernorm.bias"],
        "MAPHead_0/MultiHeadDotProductAttention_0/out/kernel":
            files["head.attention.out_proj.weight"].T.reshape(heads, -1, width),
        "MAPHead_0/MultiHeadDotProductAttention_0/out/bias": files["head.attention.out_proj.bias"],
    }
    for i, name in enumerate(("query", "key", "value")):
        kernel = np.split(files["head.attention.in_proj_weight"], 3)[i]
        bias = np.split(files["head.attention.in_proj_bias"], 3)[i]
        img[f"MAPHead_0/MultiHeadDotProductAttention_0/{name}/kernel"] = qkv(kernel)
        img[f"MAPHead_0/MultiHeadDotProductAttention_0/{name}/bias"] = bias.reshape(heads, -1)
    for j in (0, 1):
        img[f"MAPHead_0/MlpBlock_0/Dense_{j}/kernel"] = files[f"head.mlp.fc{j + 1}.weight"].T
        img[f"MAPHead_0/MlpBlock_0/Dense_{j}/bias"] = files[f"head.mlp.fc{j + 1}.bias"]
    for i in range(HF_SIZES["num_hidden_layers"]):
        bv, hf = f"Transformer/encoderblock_{i}/", f"encoder.layers.{i}."
        for n in (0, 1):
            img[f"{bv}LayerNorm_{n}/scale"] = files[f"{hf}layer_norm{n + 1}.weight"]
            img[f"{bv}LayerNorm_{n}/bias"] = files[f"{hf}layer_norm{n + 1}.bias"]
            img[f"{bv}MlpBlock_0/Dense_{n}/kernel"] = files[f"{hf}mlp.fc{n + 1}.weight"].T
            img[f"{bv}MlpBlock_0/Dense_{n}/bias"] = files[f"{hf}mlp.fc{n + 1}.bias"]
        mha = f"{bv}MultiHeadDotProductAttention_0/"
        for name in ("query", "key", "value"):
            img[f"{mha}{name}/kernel"] = qkv(files[f"{hf}self_attn.{name[0]}_proj.weight"])
            img[f"{mha}{name}/bias"] = files[f"{hf}self_attn.{name[0]}_proj.bias"].reshape(heads, -1)
        img[f"{mha}out/kernel"] = files[f"{hf}self_attn.out_proj.weight"].T.reshape(heads, -1, width)
        img[f"{mha}out/bias"] = files[f"{hf}self_attn.out_proj.bias"]
    text = {"txt/Embed_0/embedding": np.ones((64, 16), "float32"),
            "txt/Encoder_0/encoder_norm/scale": np.ones(16, "float32"),
            "t": np.ones(1, "float32"), "b": np.zeros(1, "float32")}
    return {**{f"{prefix}img/{k}": v for k, v in img.items()},
            **{prefix + k: v for k, v in text.items()}}


@pytest.mark.parametrize("prefix, scanned", [("params/", False), ("", True)])
def test_big_vision_siglip_npz_matches_transformers(siglip, tmp_path, prefix, scanned):
    """The official big_vision SigLIP release (`params/img/...`, the MAP head as
    `MAPHead_0`; HF's converted copies drop `params/`; the so400m files scan the blocks
    into `Transformer/encoderblock/` with a depth axis) loads into the tower and gives
    HF's pooler_output; the text tower is left out with a note."""
    directory, reference = siglip
    arrays = big_vision_siglip(load_file(directory / "model.safetensors"), prefix)
    if scanned:
        blocks = [k for k in arrays if "/encoderblock_0/" in k]
        for key in blocks:
            depth = [arrays.pop(key.replace("encoderblock_0/", f"encoderblock_{i}/"))
                     for i in range(2)]
            arrays[key.replace("encoderblock_0/", "encoderblock/")] = np.stack(depth)
    np.savez(tmp_path / "siglip.npz", **arrays)
    model = keras_vit.ViT(**TINY, **SIGLIP)
    report = keras_vit.load_pretrained(model, tmp_path / "siglip.npz")
    assert report.format == "big_vision"
    assert report.messages == ["the text tower's 4 tensors are not loaded (an image model)."]
    assert relative_error(outputs(model), reference) < 1e-4


# --- the model's own round trips and features -------------------------------------------

FAMILY = {
    "siglip": dict(SIGLIP, include_top=False),
    "siglip_classifier": dict(SIGLIP, include_top=True, num_classes=5),
    "clip": dict(CLIP, include_top=False, projection_dim=PROJECTION),
    "clip_classifier": dict(CLIP, include_top=True, num_classes=5),
}


@pytest.mark.parametrize("name", FAMILY)
def test_family_contract(name, tmp_path):
    check_family_contract(FAMILY[name], tmp_path)


def test_npz_round_trip_keeps_the_map_head_and_the_projection(tmp_path):
    """save_npz writes the MAP head under big_vision's keys (MAPHead_0/...), the
    pre-norm and the projection; load_pretrained restores every weight exactly."""
    for family in (SIGLIP, dict(CLIP, projection_dim=PROJECTION)):
        model = keras_vit.ViT(**TINY, **family)
        randomise_weights(model, seed=2)
        keras_vit.save_npz(model, tmp_path / "m.npz")
        again = keras_vit.ViT(**TINY, **family)
        keras_vit.load_pretrained(again, tmp_path / "m.npz")
        for a, b in zip(model.weights, again.weights, strict=True):
            np.testing.assert_array_equal(as_numpy(a), as_numpy(b))
    keys = set(np.load(tmp_path / "m.npz"))
    assert {"pre_norm/scale", "projection/kernel"} <= keys and "embedding/bias" not in keys


def test_paper_vit_config_has_no_tower_keys():
    config = keras_vit.ViT(**TINY).get_config()
    assert not set(config) & {"pre_norm", "quick_gelu", "patch_bias", "projection_dim"}


@pytest.mark.parametrize("arguments, message", [
    (dict(quick_gelu=True, gelu_approximate=True), "quick_gelu=True replaces GELU"),
    (dict(projection_dim=0), "projection_dim must be a positive integer, got 0"),
    (dict(pre_norm="yes"), "pre_norm must be True or False, got 'yes'"),
    (dict(classifier="map", distilled=True), "distilled=True .* classifier='map'"),
])
def test_bad_tower_switches_are_named(arguments, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT(**TINY, **arguments)


def test_siglip_fine_tunes_from_its_directory_with_a_new_head(siglip):
    """ViT(weights=DIR, num_classes=...) takes the tower's switches from config.json,
    loads the MAP head and puts a zero head on its pooled features."""
    model = keras_vit.ViT(weights=siglip[0], num_classes=5)
    config = model.get_config()
    assert (config["classifier"], config["include_top"]) == ("map", True)
    head = keras_vit.vit_parts(model).head
    assert head.kernel.shape == (WIDTH, 5) and not np.any(as_numpy(head.kernel))
    pooled = keras.Model(model.input, keras_vit.vit_parts(model).pool.output)
    assert relative_error([as_numpy(pooled(IMAGES))], siglip[1][:1]) < 1e-4


@pytest.mark.parametrize("tower", ["siglip", "clip"])
def test_vit_weights_of_a_tower_without_num_classes_is_the_tower(tower, request):
    """ViT(weights=DIR) without num_classes: the tower pretrained(DIR) builds, its output
    HF's pooler_output (SigLIP's MAP head) or image_embeds (CLIP's projection); it asked
    for num_classes or include_top=False before."""
    directory, reference = request.getfixturevalue(tower)
    model = keras_vit.ViT(weights=directory)
    assert model.get_config() == keras_vit.pretrained(directory).get_config()
    assert relative_error(outputs(model), reference) < 1e-4


def test_clip_fine_tuning_drops_the_projection_as_pre_logits(clip):
    model = keras_vit.ViT(weights=clip[0], num_classes=5)
    assert "projection_dim" not in model.get_config()
    report = keras_vit.load_pretrained(model, clip[0])
    assert ("the model has no projection (projection_dim=None): the checkpoint's projection "
            "is not loaded.") in report.messages


def test_siglip_feature_maps_are_every_token(siglip):
    """Without a class token every output token is a patch: the maps hold them all."""
    model = keras_vit.pretrained(siglip[0])
    maps = keras_vit.feature_model(model)(IMAGES)
    assert tuple(maps.shape) == (3, 4, 4, WIDTH)
    np.testing.assert_array_equal(as_numpy(maps).reshape(3, 16, WIDTH), outputs(model)[-1])


def test_siglip_at_another_size_is_a_model_built_there(siglip, tmp_path):
    """dynamic_image_size at 48 px equals a 48 px model given the weights by
    load_pretrained; HF's interpolate_pos_encoding (torch bicubic without antialias,
    a = -0.75) differs from timm's resampling keras-vit uses by 0.2% of the output here."""
    directory = siglip[0]
    images = np.random.default_rng(1).uniform(-1, 1, (2, 48, 48, 3)).astype("float32")
    dynamic = keras_vit.pretrained(directory, dynamic_image_size=True)
    fixed = keras_vit.ViT(**{**TINY, **SIGLIP, "image_size": 48})
    keras_vit.load_pretrained(fixed, directory)
    ours = as_numpy(dynamic(images))
    assert relative_error([ours], [as_numpy(fixed(images))]) < 1e-5
    hf = transformers.SiglipVisionModel.from_pretrained(directory).eval()
    with torch.no_grad():
        theirs = hf(pixel_values=pixels(images), interpolate_pos_encoding=True).pooler_output
    assert 1e-4 < relative_error([ours], [theirs.numpy()]) < 5e-3


@pytest.mark.slow  # about 20 s
@pytest.mark.skipif(os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow",
                    reason="exported from TensorFlow here (JAX exports are test_export's)")
@pytest.mark.parametrize("family", ["siglip", "clip"])
def test_fine_tuned_tower_exports_as_a_saved_model_with_its_preprocessing(
        family, siglip, clip, tmp_path):
    """The SavedModel's `logits` signature (pixels in [0, 255]) equals the model on the
    pixels normalised with the checkpoint's mean and std (CLIP's OpenAI statistics)."""
    import tensorflow as tf

    from keras_vit.models.preprocessing import model_preprocessing, normalize

    directory = (siglip if family == "siglip" else clip)[0]
    model = keras_vit.ViT(weights=directory, num_classes=5)
    randomise_weights(model, seed=4)  # a head that is not zero
    keras_vit.export_saved_model(model, tmp_path / "served")
    pixels = np.random.default_rng(2).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    served = tf.saved_model.load(str(tmp_path / "served")).signatures["logits"](
        images=tf.constant(pixels))["logits"].numpy()
    expected = as_numpy(model(normalize(pixels, model_preprocessing(model))))
    assert relative_error([served], [expected]) < 1e-5


def test_onnx_export_of_every_tower_switch_matches_keras(tmp_path):
    """One model with the MAP head, pre_norm, quick GELU, no patch bias and the projection,
    exported to ONNX on this backend and run by onnxruntime."""
    pytest.importorskip("onnxruntime")
    from keras_vit.export.onnx import check_onnx, export_onnx
    from keras_vit.export.records import TOLERANCE

    model = keras_vit.ViT(**{**TINY, **SIGLIP, **CLIP, "gelu_approximate": False},
                          projection_dim=PROJECTION)
    randomise_weights(model, seed=5)
    export_onnx(model, tmp_path / "tower.onnx")
    assert check_onnx(model, tmp_path / "tower.onnx", batch_size=2) <= TOLERANCE


@pytest.mark.slow  # about 20 s
def test_int8_map_head_and_projection_round_trip_through_a_keras_file(tmp_path):
    """model.quantize("int8") reaches the MAP head's and the projection's Dense layers,
    and the .keras file restores them quantized (the head's `dense_dtypes`)."""
    model = keras_vit.ViT(**{**TINY, **SIGLIP}, projection_dim=PROJECTION)
    randomise_weights(model, seed=3)
    model.quantize("int8")
    pool = keras_vit.vit_parts(model).pool
    assert all(layer.quantization_mode == "int8" for layer in pool.projections())
    assert keras_vit.vit_parts(model).projection.quantization_mode == "int8"
    assert_keras_file_round_trip(model, IMAGES, tmp_path / "int8.keras")


def test_lora_factors_the_map_head_and_trains_the_tower_norms():
    from keras_vit.training.lora import enable_lora

    model = keras_vit.ViT(**{**TINY, **SIGLIP, **CLIP, "include_top": True, "num_classes": 5,
                             "quick_gelu": False})
    assert enable_lora(model, 2, train_norms=True)["layers"] == 2 * 4 + 5
    trainable = {v.path for v in model.trainable_weights}
    assert {"pool/query/lora_kernel_a", "pool/key_value/lora_kernel_b", "pre_norm/gamma",
            "pool/norm/gamma", "head/kernel"} <= trainable
    assert "pool/probe" not in trainable and "pool/query/kernel" not in trainable


@pytest.mark.slow
def test_engine_fine_tunes_a_siglip_directory_with_a_new_head(siglip, tmp_path, caplog):
    import logging

    from keras_vit import cli
    from keras_vit.training.config import apply_overrides
    from keras_vit.training.engine import train

    arch = ("model.kwargs={'patch_size': 8, 'hidden_dim': 32, 'num_layers': 2, 'num_heads': 4, "
            "'mlp_dim': 64, 'classifier': 'map', 'gelu_approximate': True}")
    config = apply_overrides(cli.load_recipe("demo"), [
        "model.variant=custom", arch, "model.image_size=16", "model.channels=3",
        f"model.init_from={siglip[0]}", "data.classes=0-4", "schedule.epochs=1",
        "schedule.warmup_updates=2", "checkpointing.tensorboard=False", f"out={tmp_path / 'run'}",
    ])
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        result = train(config, verbose=0)
    assert "the checkpoint has no head: the head is reset to zeros." in caplog.text
    parts = keras_vit.vit_parts(result.model)
    assert isinstance(parts.pool, keras_vit.layers.MAPHead)
    assert parts.head.kernel.shape == (WIDTH, 5)
    assert result.model.get_config()["preprocessing"]["interpolation"] == "bicubic"


# --- registry ---------------------------------------------------------------------------


def test_registry_lists_the_towers_with_their_switches_and_preprocessing():
    from keras_vit.weights import registry
    from keras_vit.weights.pretrained import source_defaults

    entries = {e.name: e for e in keras_vit.list_weights("siglip") + keras_vit.list_weights("clip")}
    assert sorted(entries) == sorted([
        "vit_base_patch16_clip_224.openai", "vit_base_patch16_siglip_224.v2_webli",
        "vit_base_patch16_siglip_224.webli", "vit_base_patch32_clip_224.openai",
        "vit_large_patch14_clip_224.openai", "vit_so400m_patch14_siglip_384.webli",
        "siglip2-base-patch16-naflex", "siglip2-so400m-patch16-naflex",
    ])
    entry = entries["vit_base_patch32_clip_224.openai"]
    assert entry.url == registry.TIMM_HUB.format(name=entry.name)
    assert entry.preprocessing == dict(mean=OPENAI_MEAN, std=OPENAI_STD,
                                       interpolation="bicubic", antialias=True,
                                       crop_fraction=1.0)
    assert entries["vit_base_patch16_siglip_224.v2_webli"].preprocessing["interpolation"] == "bilinear"
    # What ViT(weights=NAME) takes from the entry: the tower's switches, not the projection.
    assert source_defaults("vit_base_patch16_clip_224.openai", {"num_classes": 5}) == dict(
        variant="B/16", image_size=224, num_classes=5, pre_norm=True,
        quick_gelu=True, patch_bias=False, layer_norm_epsilon=1e-5,
    )
    # Without num_classes nor include_top: the tower as released, CLIP's projection kept.
    for name, entry in entries.items():
        assert source_defaults(name, {}) == entry.build_args()
    with pytest.raises(ValueError, match=r"are an image tower without classes: pass "
                       r"num_classes=\.\.\. .* leave num_classes and include_top out"):
        keras_vit.ViT(weights="vit_base_patch16_siglip_224.webli", include_top=True)


@pytest.mark.parametrize("name, reference", [
    ("vit_base_patch16_siglip_224.webli", "SiglipVisionModel"),
    ("vit_base_patch32_clip_224.openai", "CLIPVisionModelWithProjection"),
    ("siglip2-base-patch16-naflex", "Siglip2VisionModel"),
])
def test_registry_towers_have_the_parameters_of_transformers_model(name, reference):
    """The entry's model has as many weights as HF's model of the release's config
    (transformers' defaults are these base models), counted on the meta device."""
    entry = keras_vit.weights.registry.get_weights(name)
    config_class = getattr(transformers, reference.replace("WithProjection", "").replace(
        "Model", "Config"))
    config = config_class(projection_dim=512) if "CLIP" in reference else config_class()
    with torch.device("meta"):
        expected = sum(p.numel() for p in getattr(transformers, reference)(config).parameters())
    model = keras_vit.ViT(**entry.build_args())
    assert model.count_params() == expected
