"""DINOv3 (`keras_vit.families.dinov3`) against its references: HF transformers'
`DINOv3ViTModel` run here (tiny random models, GELU and gated MLP, 4 registers, layer
scale, no key bias), and timm's own outputs of tiny random models of its DINOv3
architectures, written once with timm (tests/fixtures/dinov3_timm/make.py; timm does not
import in this environment). Both are loaded from their files as saved
(`save_pretrained`, `save_for_hf`) with no other argument, and compared at the size
they were built at and at other sizes, non-square too: the rotary embedding has no
table, so any multiple of the patch runs.
"""

import json
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
import torch

import keras_vit
from family_contract import check_family_contract, fine_tune, predicted, probe, relative_error
from keras_vit.families import dinov3
from keras_vit.families.family import rotate_half_order
from keras_vit.layers.dinov3_rope import DINOv3RotaryEmbedding

FIXTURES = Path(__file__).parent / "fixtures" / "dinov3_timm"
TIMM_KINDS = ("vit_small_patch16_dinov3", "vit_small_plus_patch16_dinov3_qkvb")
WIDTH, HEADS, LAYERS, MLP, PATCH, SIZE = 32, 4, 2, 48, 16, 64
# The trained size, then sizes HF's model also runs at: non-square, smaller, larger.
SIZES = ((SIZE, SIZE), (48, 80), (32, 32), (96, 48))


def images(height, width, seed=1, count=2):
    return np.random.default_rng(seed).standard_normal((count, height, width, 3)).astype("float32")


def hf_dinov3(directory, gated, patch=PATCH, seed=0):
    """A tiny HF `DINOv3ViTModel` with random weights (LayerNorm scales near 1, every
    other tensor, layer scales and biases too, drawn), saved to `directory`."""
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    torch.manual_seed(seed)
    config = DINOv3ViTConfig(
        hidden_size=WIDTH, intermediate_size=MLP, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_register_tokens=4, use_gated_mlp=gated,
        hidden_act="silu" if gated else "gelu", image_size=SIZE, patch_size=patch,
    )
    config._attn_implementation = "eager"  # returns its attention weights
    model = DINOv3ViTModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim > 1 else 0.5)
                    + (1.0 if "norm" in name and name.endswith("weight") else 0.0))
    model.save_pretrained(directory)
    return model


def hf_outputs(model, pixels):
    """HF's pooler output, last hidden state and each block's tokens."""
    with torch.no_grad():
        out = model(torch.from_numpy(pixels.transpose(0, 3, 1, 2)), output_hidden_states=True)
    return [out.pooler_output.numpy(), out.last_hidden_state.numpy(),
            *(h.numpy() for h in out.hidden_states[1:])]


def outputs(model, pixels):
    """The model's output (pooled class token), its final normed tokens and each block's,
    through `predicted`: these tests run one model at many sizes."""
    return predicted(probe(model, final_norm=True), pixels)


@pytest.fixture(scope="module", params=["gelu", "gated"])
def hf_model(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    return directory, hf_dinov3(directory, request.param == "gated")


# ---------------------------------------------------------------------------
# The rotary embedding.


@pytest.mark.parametrize("grid", [(4, 4), (3, 5), (14, 9)])
def test_rope_table_is_hfs_with_each_heads_channels_reordered(grid):
    """The table's patch rows are HF's `DINOv3ViTRopePositionEmbedding` sines and
    cosines, channels in `rotate_half_order` (interleaved pairs of `rotate_half`'s); the
    prefix rows rotate nothing."""
    from transformers import DINOv3ViTConfig
    from transformers.models.dinov3_vit.modeling_dinov3_vit import DINOv3ViTRopePositionEmbedding

    head_dim, prefix = 16, 5
    config = DINOv3ViTConfig(hidden_size=4 * head_dim, num_attention_heads=4, patch_size=PATCH)
    reference = DINOv3ViTRopePositionEmbedding(config).eval()
    cos, sin = reference(torch.zeros(1, 3, grid[0] * PATCH, grid[1] * PATCH))
    table = keras.ops.convert_to_numpy(
        DINOv3RotaryEmbedding(head_dim, grid_size=grid, num_prefix_tokens=prefix)(
            keras.ops.zeros((1, grid[0] * grid[1], 8))))
    ours_sin, ours_cos = np.split(table, 2, axis=-1)
    order = rotate_half_order(head_dim)
    np.testing.assert_allclose(ours_sin[prefix:], sin.numpy()[:, order], atol=2e-6)
    np.testing.assert_allclose(ours_cos[prefix:], cos.numpy()[:, order], atol=2e-6)
    np.testing.assert_array_equal(ours_sin[:prefix], 0.0)
    np.testing.assert_array_equal(ours_cos[:prefix], 1.0)


def test_rope_takes_no_reference_grid_and_keeps_its_config():
    rope = DINOv3RotaryEmbedding(8, grid_size=(2, 3), num_prefix_tokens=5, temperature=50.0)
    assert keras.saving.get_registered_name(DINOv3RotaryEmbedding) == dinov3.rope()["class_name"]
    config = rope.get_config()
    assert "reference_grid" not in config
    assert DINOv3RotaryEmbedding.from_config(config).get_config() == config
    with pytest.raises(TypeError, match="reference_grid"):
        DINOv3RotaryEmbedding(8, grid_size=(2, 3), reference_grid=(4, 4))


# ---------------------------------------------------------------------------
# HF transformers' DINOv3ViTModel.


def test_hf_directory_builds_with_no_argument_and_equals_hf(hf_model):
    """`keras_vit.pretrained(DIR)` of a `save_pretrained` directory builds the model from
    its config alone; the pooler output, last hidden state and every block's tokens are
    within 1e-4 of HF's at the size it was built at and at other sizes, non-square too."""
    directory, reference = hf_model
    model = keras_vit.pretrained(str(directory))
    config = model.get_config()
    assert (config["num_registers"], config["pos_embedding"], config["rope"]) == (
        4, "none", dinov3.rope())
    assert model.input_shape == (None, None, None, 3)
    for height, width in SIZES:
        pixels = images(height, width)
        ours = outputs(model, pixels)
        assert relative_error(ours, hf_outputs(reference, pixels)) < 1e-4, (height, width)


def test_negative_control_without_the_channel_order_hf_disagrees(hf_model, monkeypatch):
    """The comparison can fail: q and k read in HF's own channel order (no reordering
    into interleaved pairs) give other attention, and outputs far from HF's."""
    from keras_vit.weights import formats

    directory, reference = hf_model
    monkeypatch.setattr(formats, "rotate_half_order", np.arange)
    model = keras_vit.pretrained(str(directory))
    pixels = images(SIZE, SIZE)
    assert relative_error(outputs(model, pixels)[1:2], hf_outputs(reference, pixels)[1:2]) > 1e-2


def test_negative_control_evas_rope_convention_disagrees_and_is_refused(hf_model):
    """EVA-02's rotary embedding (grid indices, base 10000) in place of DINOv3's: the
    checkpoint is refused naming the switch; forced in (`strict=False`, a warning), its
    outputs are far from HF's."""
    directory, reference = hf_model
    arguments = dict(keras_vit.pretrained(str(directory)).get_config(), rope=True)
    arguments.pop("name")
    model = keras_vit.ViT(**arguments)
    with pytest.raises(ValueError, match=r"trained with the rotary position embedding "
                                         r"keras_vit>DINOv3RotaryEmbedding.*the model has "
                                         r"keras_vit>RotaryEmbedding: build the model with rope="):
        keras_vit.load_pretrained(model, str(directory))
    report = keras_vit.load_pretrained(model, str(directory), strict=False)
    assert any("strict=False" in message for message in report.messages)
    pixels = images(SIZE, SIZE)
    assert relative_error(outputs(model, pixels)[1:2], hf_outputs(reference, pixels)[1:2]) > 1e-2


def test_a_model_without_rope_refuses_a_dinov3_checkpoint(hf_model):
    directory, _ = hf_model
    arguments = dict(keras_vit.pretrained(str(directory)).get_config(), rope=False)
    arguments.pop("name")
    with pytest.raises(ValueError, match=r"DINOv3RotaryEmbedding, which has no tensors, but "
                                         r"the model has none: build the model with rope="):
        keras_vit.load_pretrained(keras_vit.ViT(**arguments), str(directory))


def edited_copy(directory, tmp_path, **changes):
    """A copy of the HF directory with `changes` written into its config.json."""
    copy = tmp_path / "edited"
    shutil.copytree(directory, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, **changes}))
    return copy


@pytest.mark.parametrize("changes, message", [
    (dict(hidden_size=48), r"says hidden_size=48, but its weights' "
                           r"embeddings\.patch_embeddings\.weight \(32, 3, 16, 16\) hold width 32"),
    (dict(patch_size=8), r"says patch_size=8, but its weights' "
                         r"embeddings\.patch_embeddings\.weight .* hold 16x16 patches"),
])
def test_a_config_disagreeing_with_its_tensors_is_refused_naming_both(
        hf_model, tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.pretrained(str(edited_copy(hf_model[0], tmp_path, **changes)))


def test_a_config_with_registers_its_tensors_lack_is_refused(hf_model, tmp_path):
    with pytest.raises(ValueError, match=r"\breg\b.*\(1, 4, 32\).*\(1, 2, 32\)|"
                                         r"\(1, 2, 32\).*\(1, 4, 32\)"):
        keras_vit.pretrained(str(edited_copy(hf_model[0], tmp_path, num_register_tokens=2)))


@pytest.mark.parametrize("gated, activation", [(True, "gelu"), (False, "silu")])
def test_an_activation_keras_vit_does_not_build_is_refused(hf_model, tmp_path, gated, activation):
    copy = edited_copy(hf_model[0], tmp_path, use_gated_mlp=gated, hidden_act=activation)
    with pytest.raises(ValueError, match=f"hidden_act='{activation}' with use_gated_mlp="
                                         f"{str(gated).lower()}"):
        keras_vit.pretrained(str(copy))


# ---------------------------------------------------------------------------
# timm's DINOv3 (its Eva class), from the outputs timm computed (fixtures).


def timm_reference(kind, size):
    saved = np.load(FIXTURES / f"{kind}_outputs.npz")
    key = f"{size[0]}x{size[1]}"
    return saved[f"{key}/images"], [saved[f"{key}/pooled"], saved[f"{key}/tokens"],
                                    *(saved[f"{key}/block_{i}"] for i in range(LAYERS))]


@pytest.mark.parametrize("kind", TIMM_KINDS)
def test_timm_folder_builds_with_no_argument_and_equals_timm(kind):
    """`keras_vit.pretrained(DIR)` of a folder as timm's `save_for_hf` writes it builds
    the model from its config.json (architecture, the model_args it was created with,
    pretrained_cfg's preprocessing) and equals timm's outputs, every block too."""
    model = keras_vit.pretrained(str(FIXTURES / kind))
    config = model.get_config()
    assert (config["hidden_dim"], config["mlp_dim"], config["rope"]) == (WIDTH, MLP, dinov3.rope())
    assert config["preprocessing"]["interpolation"] == "bicubic"  # timm's pretrained_cfg
    for size in ((SIZE, SIZE), (48, 80)):
        pixels, reference = timm_reference(kind, size)
        assert relative_error(outputs(model, pixels), reference) < 1e-4, size


def test_negative_control_timm_without_the_channel_order_disagrees(monkeypatch):
    from keras_vit.weights import formats

    monkeypatch.setattr(formats, "rotate_half_order", np.arange)
    model = keras_vit.pretrained(str(FIXTURES / TIMM_KINDS[1]))
    pixels, reference = timm_reference(TIMM_KINDS[1], (SIZE, SIZE))
    assert relative_error(outputs(model, pixels)[1:2], reference[1:2]) > 1e-2


def tiny(**overrides):
    """A tiny DINOv3 of the fixtures' and HF models' sizes (`SWITCHES` otherwise)."""
    return keras_vit.ViT(**{**dinov3.SWITCHES, "image_size": SIZE, "patch_size": PATCH,
                            "hidden_dim": WIDTH, "num_layers": LAYERS, "num_heads": HEADS,
                            "mlp_dim": MLP, **overrides})


@pytest.mark.parametrize("kind, entry", [
    ("vit_small_patch16_dinov3", "vit_small_patch16_dinov3.lvd1689m"),
    ("vit_small_plus_patch16_dinov3_qkvb", "vit_small_plus_patch16_dinov3.lvd1689m"),
])
def test_timm_state_dict_into_the_registry_entrys_switches_equals_timm(kind, entry):
    """A timm `vit_*_patch16_dinov3` state dict (GELU without q/v biases; SwiGLU with
    them) loads into the model its registry entry builds (sizes shrunk to the file's),
    and equals timm's own outputs, every block too, at the trained size and another."""
    from keras_vit.weights import registry

    switches = {k: v for k, v in registry.get_weights(entry).model_args.items()
                if k not in ("hidden_dim", "num_layers", "num_heads", "mlp_dim")}
    model = tiny(**switches)
    report = keras_vit.load_pretrained(model, FIXTURES / kind / "model.safetensors")
    assert report.format == "timm" and not (report.missing or report.unexpected)
    assert any("no key bias: loaded as zeros" in message for message in report.messages)
    for size in ((SIZE, SIZE), (48, 80)):
        pixels, reference = timm_reference(kind, size)
        assert relative_error(outputs(model, pixels), reference) < 1e-4, size


# ---------------------------------------------------------------------------
# The registry.

RELEASED = {  # timm name: (width, depth, heads, MLP width, MLP), timm eva.py
    "vit_small_patch16_dinov3": (384, 12, 6, 1536, "gelu"),
    "vit_small_plus_patch16_dinov3": (384, 12, 6, 1536, "swiglu"),
    "vit_base_patch16_dinov3": (768, 12, 12, 3072, "gelu"),
    "vit_large_patch16_dinov3": (1024, 24, 16, 4096, "gelu"),
    "vit_huge_plus_patch16_dinov3": (1280, 32, 20, 5120, "swiglu"),
    "vit_7b_patch16_dinov3": (4096, 40, 32, 8192, "swiglu"),
}


def test_registry_lists_the_released_checkpoints_with_hfs_preprocessing():
    """S, S+, B, L, H+ and 7B on LVD-1689M, L and 7B on SAT-493M: timm's copies, sizes as
    timm's architectures, preprocessing as HF's `DINOv3ViTImageProcessor` (224 x 224,
    the whole image, antialiased bilinear, ImageNet mean and std; the satellite
    statistics for SAT)."""
    entries = {e.name: e for e in keras_vit.list_weights("*_dinov3.*")}
    assert sorted(entries) == sorted(
        [f"{arch}.lvd1689m" for arch in RELEASED]
        + ["vit_large_patch16_dinov3.sat493m", "vit_7b_patch16_dinov3.sat493m"])
    for name, entry in entries.items():
        width, depth, heads, mlp_dim, mlp = RELEASED[name.split(".")[0]]
        args = entry.build_args()
        assert (args["hidden_dim"], args["num_layers"], args["num_heads"], args["mlp_dim"],
                args.get("mlp", "gelu")) == (width, depth, heads, mlp_dim, mlp)
        assert (args["patch_size"], args["num_registers"], args["rope"], args["include_top"]) == (
            16, 4, dinov3.rope(), False)
        assert entry.url == f"https://huggingface.co/timm/{name}/resolve/main/model.safetensors"
        satellite = name.endswith("sat493m")
        assert entry.preprocessing == dict(
            mean=[0.43, 0.411, 0.296] if satellite else [0.485, 0.456, 0.406],
            std=[0.213, 0.156, 0.143] if satellite else [0.229, 0.224, 0.225],
            interpolation="bilinear", antialias=True, crop_fraction=None)


@pytest.mark.parametrize("name, gated", [("vit_small_patch16_dinov3.lvd1689m", False),
                                         ("vit_small_plus_patch16_dinov3.lvd1689m", True)])
def test_registry_models_have_hfs_parameter_count(name, gated):
    """The S/16 and S+/16 entries build as many parameters as HF's model of the release's
    config (its mask token, pretraining only, aside)."""
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    from keras_vit.weights import registry

    width, depth, heads, mlp_dim, _ = RELEASED[name.split(".")[0]]
    reference = DINOv3ViTModel(DINOv3ViTConfig(
        hidden_size=width, num_hidden_layers=depth, num_attention_heads=heads,
        intermediate_size=mlp_dim, use_gated_mlp=gated, num_register_tokens=4,
        key_bias=True))  # keras-vit holds the zero key bias
    count = sum(p.numel() for n, p in reference.named_parameters() if "mask_token" not in n)
    assert keras_vit.ViT(**registry.get_weights(name).build_args()).count_params() == count


# ---------------------------------------------------------------------------
# keras-vit's features on a DINOv3 loaded from HF, against HF where it computes them.


def test_feature_maps_leave_out_the_registers_and_attention_is_hfs(hf_model):
    """The feature maps (final norm applied) are HF's last hidden state after the class
    token and the 4 registers, on the patch grid; the prefix tokens come apart. Every
    block's attention weights are HF's (reordering q and k alike leaves them as they
    are), and the attention map covers the patches only."""
    directory, reference = hf_model
    model = keras_vit.pretrained(str(directory))
    pixels = images(48, 80)
    with torch.no_grad():
        hf = reference(torch.from_numpy(pixels.transpose(0, 3, 1, 2)), output_attentions=True)
    tokens = hf.last_hidden_state.numpy()
    maps, prefix = keras_vit.feature_model(model, norm=True, prefix_tokens=True)(pixels)
    assert tuple(maps.shape) == (2, 3, 5, WIDTH)
    ours = [keras.ops.convert_to_numpy(maps).reshape(2, 15, WIDTH),
            keras.ops.convert_to_numpy(prefix)]
    assert relative_error(ours, [tokens[:, 5:], tokens[:, :5]]) < 1e-4
    _, attentions = keras_vit.attention_model(model)(pixels)
    assert relative_error([keras.ops.convert_to_numpy(a) for a in attentions],
                          [a.numpy() for a in hf.attentions]) < 1e-4
    rollout = keras_vit.attention_rollout(attentions)
    prefix_count = keras_vit.vit_parts(model).num_prefix_tokens
    assert prefix_count == 5
    attention = keras_vit.attention_map(rollout, (3, 5), prefix_count)
    assert attention.shape == (2, 3, 5)


def test_fewshot_features_are_hfs_pooler_output(hf_model):
    from keras_vit.evaluation import fewshot

    directory, reference = hf_model
    model = keras_vit.pretrained(str(directory))
    pixels, labels = images(SIZE, SIZE, seed=5, count=6), np.arange(6) % 3
    features, got = fewshot.extract_features(model, pixels, labels, batch_size=4)
    assert relative_error([features], [hf_outputs(reference, pixels)[0]]) < 1e-4
    np.testing.assert_array_equal(got, labels)


@pytest.mark.parametrize("mlp", [{}, dict(mlp="swiglu")])
def test_family_contract(mlp, tmp_path):
    """The family contract (tests/family_contract.py) on DINOv3's switches: config and
    `.keras` round trip (the rope layer's config kept), `save_npz`, any size, mixed
    precision, feature and attention maps without the registers, LoRA."""
    check_family_contract(dict(dinov3.SWITCHES, **mlp), tmp_path)


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="exported from TensorFlow or JAX")
def test_saved_model_serves_any_size_as_keras_does(hf_model, tmp_path):
    """A classifier on the DINOv3 (`ViT(weights=DIR, num_classes=3)`, head drawn at
    random) exported with `native_resolution`: the SavedModel computes the rotary table
    for each input's grid, and serves a size other than the trained one as Keras does."""
    import tensorflow as tf

    model = keras_vit.ViT(weights=str(hf_model[0]), num_classes=3, dynamic_image_size=True)
    head = keras_vit.vit_parts(model).head
    head.kernel.assign(np.random.default_rng(2).normal(size=head.kernel.shape))
    keras_vit.export_saved_model(model, tmp_path / "export", native_resolution=True)
    served = tf.saved_model.load(str(tmp_path / "export"))
    signature = next(iter(served.signatures.values()))
    pixels = np.random.default_rng(4).uniform(0, 255, (2, 48, 80, 3)).astype("float32")
    expected = keras.ops.convert_to_numpy(model(keras_vit.preprocess(pixels)))
    got = next(iter(signature(images=tf.constant(pixels)).values())).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def test_onnx_export_matches_keras(hf_model, tmp_path):
    pytest.importorskip("onnxruntime")
    from keras_vit.export.onnx import check_onnx, export_onnx
    from keras_vit.export.records import TOLERANCE

    model = keras_vit.pretrained(str(hf_model[0]), dynamic_image_size=False)
    export_onnx(model, tmp_path / "dinov3.onnx")
    assert check_onnx(model, tmp_path / "dinov3.onnx", batch_size=2) <= TOLERANCE


@pytest.mark.slow
def test_engine_fine_tunes_from_an_hf_directory(tmp_path, caplog):
    """The engine's one-epoch fine-tune of the demo recipe (5 digit classes, 16 px) from
    an HF DINOv3 directory (patch 8): every tensor loaded, the new head at zeros."""
    hf_dinov3(tmp_path / "hf", gated=True, patch=8)
    kwargs = {k: v for k, v in dinov3.SWITCHES.items() if k != "include_top"}
    kwargs.update(patch_size=8, hidden_dim=WIDTH, num_layers=LAYERS, num_heads=HEADS,
                  mlp_dim=MLP, mlp="swiglu", layer_scale_init=1.0)
    result = fine_tune(tmp_path / "hf", kwargs, 16, tmp_path / "run", caplog)
    assert "the checkpoint has no head: the head is reset to zeros." in caplog.text
    parts = keras_vit.vit_parts(result.model)
    assert isinstance(parts.rope, DINOv3RotaryEmbedding)
    assert tuple(parts.head.kernel.shape) == (WIDTH, 5)
