"""EVA-02 (timm `eva.py`) as switches of keras-vit's ViT, against timm's formulas.

HF transformers has no EVA-02 model and timm does not import here (it needs
torchvision), so the reference is timm's forward pass written out in float32 torch
below: the rotary embedding (`RotaryEmbeddingCat`, `in_pixels=False`, `ref_feat_shape`;
`apply_rot_embed_cat`), `EvaAttention` with q and v biases and no k bias (fused `qkv`
with `q_bias`/`v_bias`, or separate `q_proj`/`k_proj`/`v_proj`), SwiGLU (packed `fc1`,
gate first; or `fc1_g`/`fc1_x` with the `mlp.norm` of `scale_mlp=True`), the mean of the
patch tokens and `fc_norm`. It is fed random weights in timm's state-dict layout, which
keras-vit loads from a safetensors file.
"""

import math
import re

import keras
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import keras_vit
from helpers import bucket_entry
from family_contract import (
    assert_maps_leave_out_prefix, check_family_contract, fine_tune, outputs, relative_error,
)
from references import random_timm_state, whitened_with_bias

LAYERS, WIDTH, HEADS, SIZE, PATCH, CLASSES = 2, 32, 4, 28, 7, 6
MLP = int(WIDTH * 4 * 2 / 3)  # timm's eva02 mlp_ratio=4 * 2 / 3: 85
# The two layouts of timm's EVA-02: tiny and small (fused qkv, packed SwiGLU) and base
# and large (separate projections, SwiGLU with its norm), with the reference grid of
# rope's scaling (the 448 px models scale a 32x32 grid to 16x16).
KINDS = {
    "small": dict(mlp_norm=False, reference=(4, 4)),
    "base": dict(mlp_norm=True, reference=(3, 2)),
}


def images(height=SIZE, width=SIZE, seed=0, count=2):
    return np.random.default_rng(seed).uniform(-1, 1, (count, height, width, 3)).astype("float32")


def eva_state(kind, seed=3):
    """A random timm EVA-02 state dict of `kind` (`random_timm_state`)."""
    def block(normal, b):
        if kind == "small":
            return {
                b + "attn.qkv.weight": normal(3 * WIDTH, WIDTH),
                b + "attn.q_bias": normal(WIDTH), b + "attn.v_bias": normal(WIDTH),
                b + "mlp.fc1.weight": normal(2 * MLP, WIDTH), b + "mlp.fc1.bias": normal(2 * MLP),
            }
        return {
            b + "attn.q_proj.weight": normal(WIDTH, WIDTH), b + "attn.q_proj.bias": normal(WIDTH),
            b + "attn.k_proj.weight": normal(WIDTH, WIDTH),
            b + "attn.v_proj.weight": normal(WIDTH, WIDTH), b + "attn.v_proj.bias": normal(WIDTH),
            b + "mlp.fc1_g.weight": normal(MLP, WIDTH), b + "mlp.fc1_g.bias": normal(MLP),
            b + "mlp.fc1_x.weight": normal(MLP, WIDTH), b + "mlp.fc1_x.bias": normal(MLP),
            b + "mlp.norm.weight": normal(MLP, mean=1.0), b + "mlp.norm.bias": normal(MLP),
        }

    return random_timm_state(seed, width=WIDTH, layers=LAYERS, classes=CLASSES, patch=PATCH,
                             positions=(SIZE // PATCH) ** 2 + 1, mlp_dim=MLP,
                             final_norm="fc_norm", block=block)


def timm_rope(rows, cols, reference):
    """timm's `build_rotary_pos_embed(..., in_pixels=False, ref_feat_shape=reference)`:
    the (rows * cols, head_dim) sines and cosines."""
    bands = (WIDTH // HEADS) // 4
    frequencies = 1.0 / (10000.0 ** (torch.arange(0, bands, 1).float() / bands))
    t = [torch.arange(s).float() / s * r for s, r in zip((rows, cols), reference)]
    grid = torch.stack(torch.meshgrid(t, indexing="ij"), dim=-1).unsqueeze(-1) * frequencies
    sin, cos = (f(grid).reshape(rows * cols, -1).repeat_interleave(2, -1)
                for f in (torch.sin, torch.cos))
    return sin, cos


def timm_pre_logits(state, tokens):
    """timm's `Eva.forward_head(pre_logits=True)` with avg pooling: the mean of the patch
    tokens (after the class token) through `fc_norm`."""
    pooled = torch.as_tensor(tokens)[:, 1:].mean(1)
    return torch.nn.functional.layer_norm(
        pooled, (WIDTH,), torch.from_numpy(state["fc_norm.weight"]),
        torch.from_numpy(state["fc_norm.bias"]), 1e-6)


def timm_eva_forward(state, pixels, kind, reference, rope=True):
    """timm's `Eva.forward` (class token, avg pooling, fc_norm), from its formulas: the
    logits and each block's output. `rope=False` leaves the rotation out."""
    w = {k: torch.from_numpy(v) for k, v in state.items()}
    F = torch.nn.functional
    x = F.conv2d(torch.from_numpy(pixels.transpose(0, 3, 1, 2)), w["patch_embed.proj.weight"],
                 w["patch_embed.proj.bias"], stride=PATCH)
    rows, cols = x.shape[2:]
    x = torch.cat([w["cls_token"].expand(len(x), -1, -1), x.flatten(2).transpose(1, 2)], dim=1)
    table = w["pos_embed"]
    side = SIZE // PATCH
    if (rows, cols) != (side, side):  # timm's resample_abs_pos_embed (dynamic_img_size)
        grid = table[:, 1:].reshape(1, side, side, WIDTH).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(rows, cols), mode="bicubic", antialias=True,
                             align_corners=False)
        table = torch.cat([table[:, :1], grid.permute(0, 2, 3, 1).reshape(1, -1, WIDTH)], dim=1)
    x = x + table
    sin, cos = timm_rope(rows, cols, reference)

    def rotate(t):  # apply_rot_embed_cat with timm's `rot`: [-x1, x0, -x3, x2, ...]
        turned = torch.stack([-t[..., 1::2], t[..., ::2]], -1).reshape(t.shape)
        return t * cos + turned * sin

    def norm(t, name):
        return F.layer_norm(t, (t.shape[-1],), w[f"{name}.weight"], w[f"{name}.bias"], 1e-6)

    blocks = []
    for i in range(LAYERS):
        b = f"blocks.{i}."
        h = norm(x, b + "norm1")
        if kind == "small":
            bias = torch.cat([w[b + "attn.q_bias"], torch.zeros(WIDTH), w[b + "attn.v_bias"]])
            q, k, v = F.linear(h, w[b + "attn.qkv.weight"], bias).chunk(3, -1)
        else:
            q = F.linear(h, w[b + "attn.q_proj.weight"], w[b + "attn.q_proj.bias"])
            k = F.linear(h, w[b + "attn.k_proj.weight"])
            v = F.linear(h, w[b + "attn.v_proj.weight"], w[b + "attn.v_proj.bias"])
        q, k, v = (t.unflatten(-1, (HEADS, -1)).transpose(1, 2) for t in (q, k, v))
        if rope:  # the patch tokens only: the class token is not rotated
            q, k = (torch.cat([t[:, :, :1], rotate(t[:, :, 1:])], dim=2) for t in (q, k))
        attention = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(WIDTH // HEADS), -1)
        x = x + F.linear((attention @ v).transpose(1, 2).flatten(2),
                         w[b + "attn.proj.weight"], w[b + "attn.proj.bias"])
        h = norm(x, b + "norm2")
        if kind == "small":  # GluMlp(gate_last=False): silu of the first half
            gate, up = F.linear(h, w[b + "mlp.fc1.weight"], w[b + "mlp.fc1.bias"]).chunk(2, -1)
            hidden = F.silu(gate) * up
        else:  # SwiGLU(norm_layer=LayerNorm)
            hidden = F.silu(F.linear(h, w[b + "mlp.fc1_g.weight"], w[b + "mlp.fc1_g.bias"]))
            hidden = norm(hidden * F.linear(h, w[b + "mlp.fc1_x.weight"], w[b + "mlp.fc1_x.bias"]),
                          b + "mlp.norm")
        x = x + F.linear(hidden, w[b + "mlp.fc2.weight"], w[b + "mlp.fc2.bias"])
        blocks.append(x.numpy())
    pooled = timm_pre_logits(state, x)
    return [F.linear(pooled, w["head.weight"], w["head.bias"]).numpy(), *blocks]


def switches(kind, **overrides):
    """The keras-vit switches of timm's EVA-02 of `kind`."""
    return {**dict(mlp="swiglu", rope=True, rope_reference_grid=KINDS[kind]["reference"],
                   classifier="avg", fc_norm=True, mlp_norm=KINDS[kind]["mlp_norm"]),
            **overrides}


def eva(kind, **overrides):
    return keras_vit.ViT(image_size=SIZE, patch_size=PATCH, hidden_dim=WIDTH, num_layers=LAYERS,
                         num_heads=HEADS, mlp_dim=MLP, num_classes=CLASSES,
                         **switches(kind, **overrides))


@pytest.fixture(scope="module")
def timm_files(tmp_path_factory):
    """Each kind's random timm state dict, saved as safetensors."""
    files = {}
    for kind in KINDS:
        path = tmp_path_factory.mktemp(kind) / "model.safetensors"
        state = eva_state(kind)
        save_file(state, path)
        files[kind] = (path, state)
    return files


@pytest.mark.parametrize("kind", KINDS)
def test_timm_eva02_matches_timms_formulas(kind, timm_files):
    """Logits and every block's tokens within 1e-4 of timm's at the trained size (with
    rope's reference-grid scaling), and at another size: a dynamic model (the
    position table resampled as timm's `dynamic_img_size`, rope at the new grid)."""
    path, state = timm_files[kind]
    model = eva(kind, dynamic_image_size=True)
    report = keras_vit.load_pretrained(model, path)
    assert report.format == "timm"
    assert any("no key bias: loaded as zeros" in message for message in report.messages)
    reference = KINDS[kind]["reference"]
    # A file does not record rope's reference grid: one other than timm's is noted.
    assert any(f"rope scales to a {reference} grid; timm's EVA-02 are trained with "
               "rope_reference_grid=(16, 16)" in message for message in report.messages)
    for height, width in ((SIZE, SIZE), (42, 35)):
        pixels = images(height, width)
        ours = outputs(model, pixels)
        assert relative_error(ours, timm_eva_forward(state, pixels, kind, reference)) < 1e-4


@pytest.mark.parametrize("overrides", [
    dict(rope_reference_grid=None),
    dict(classifier="token", fc_norm=False),
])
def test_negative_control_a_flipped_switch_misses_timm(overrides, timm_files):
    path, state = timm_files["base"]
    model = eva("base", **overrides)
    keras_vit.load_pretrained(model, path)
    reference = timm_eva_forward(state, images(), "base", KINDS["base"]["reference"])
    assert relative_error(outputs(model, images()), reference) > 1e-2


def test_negative_control_the_reference_without_rotation_misses_keras_vit(timm_files):
    """The comparison can fail: timm's formulas without the rotation disagree."""
    path, state = timm_files["small"]
    model = eva("small")
    keras_vit.load_pretrained(model, path)
    reference = timm_eva_forward(state, images(), "small", (4, 4), rope=False)
    assert relative_error(outputs(model, images()), reference) > 1e-2


def test_a_checkpoint_with_an_mlp_norm_names_the_switch(timm_files):
    with pytest.raises(ValueError, match=r"LayerNorm inside the MLP.*build the model with "
                                         r"mlp_norm=True"):
        keras_vit.load_pretrained(eva("base", mlp_norm=False), timm_files["base"][0])


ROPE_MESSAGE = (r"EVA-02 .*trained with rotary position embeddings.*build the model with "
                r"rope=True, rope_reference_grid=\(16, 16\)")


@pytest.mark.parametrize("kind", KINDS)
def test_an_eva02_file_into_a_model_without_rope_names_the_switch(kind, timm_files):
    """rope has no tensors, so nothing is missing: the EVA-02 layout (q and v biases with
    a SwiGLU MLP) is refused by a model without rope, built by the user or by
    `ViT(weights=...)`, with the switch (and timm's reference grid) named; strict=False
    loads it with a warning, and its numbers are indeed not timm's."""
    path, state = timm_files[kind]
    no_rope = dict(rope=False, rope_reference_grid=None)
    with pytest.raises(ValueError, match=ROPE_MESSAGE):
        keras_vit.load_pretrained(eva(kind, **no_rope), path)
    arguments = {k: v for k, v in switches(kind).items() if not k.startswith("rope")}
    with pytest.raises(ValueError, match=ROPE_MESSAGE):
        keras_vit.ViT(weights=str(path), image_size=SIZE, patch_size=PATCH, hidden_dim=WIDTH,
                      num_layers=LAYERS, num_heads=HEADS, mlp_dim=MLP, num_classes=CLASSES,
                      **arguments)
    model = eva(kind, **no_rope)
    report = keras_vit.load_pretrained(model, path, strict=False)
    assert any(re.search(ROPE_MESSAGE, message) for message in report.messages)
    reference = timm_eva_forward(state, images(), kind, KINDS[kind]["reference"])
    assert relative_error(outputs(model, images()), reference) > 1e-2


def test_an_eva01_file_loads_into_a_model_without_rope(timm_files, tmp_path):
    """EVA-01 (timm `eva_giant_*`): the same q and v biases with a plain GELU MLP and no
    rope; it is not taken for an EVA-02."""
    state = dict(timm_files["small"][1])
    for i in range(LAYERS):  # fc1 as wide as fc2 takes: a plain MLP
        for name in ("weight", "bias"):
            state[f"blocks.{i}.mlp.fc1.{name}"] = state[f"blocks.{i}.mlp.fc1.{name}"][:MLP]
    save_file(state, tmp_path / "eva01.safetensors")
    model = eva("small", mlp="gelu", rope=False, rope_reference_grid=None)
    report = keras_vit.load_pretrained(model, tmp_path / "eva01.safetensors")
    assert not report.missing and not report.unexpected and not report.mismatched


def test_registry_switches_build_the_timm_layouts(timm_files):
    """The registry entries' switches (sizes aside) hold each timm layout exactly."""
    from keras_vit.weights import registry

    for kind, name in (("small", "eva02_small_patch14_336.mim_in22k_ft_in1k"),
                       ("base", "eva02_base_patch14_448.mim_in22k_ft_in22k_in1k")):
        entry = registry.get_weights(name)
        given = {k: v for k, v in entry.model_args.items()
                 if k not in ("patch_size", "hidden_dim", "num_layers", "num_heads", "mlp_dim",
                              "rope_reference_grid")}
        model = keras_vit.ViT(image_size=SIZE, patch_size=PATCH, hidden_dim=WIDTH,
                              num_layers=LAYERS, num_heads=HEADS, mlp_dim=MLP,
                              num_classes=CLASSES, rope_reference_grid=KINDS[kind]["reference"],
                              **given)
        path, state = timm_files[kind]
        keras_vit.load_pretrained(model, path)
        reference = timm_eva_forward(state, images(), kind, KINDS[kind]["reference"])
        assert relative_error(outputs(model, images()), reference) < 1e-4


def test_pretrained_builds_a_registry_eva02_with_no_arguments(timm_files, bucket):
    """`keras_vit.pretrained(NAME)` of an EVA-02 entry (here a tiny one served by the
    loopback bucket) builds the architecture from the entry alone and equals timm's."""
    import shutil

    path, state = timm_files["base"]
    shutil.copy(path, bucket.root / "eva02-tiny.safetensors")
    switches_ = switches("base", patch_size=PATCH, hidden_dim=WIDTH, num_layers=LAYERS,
                         num_heads=HEADS, mlp_dim=MLP)
    bucket_entry("test_eva02_28.random", "eva02-tiny.safetensors", image_size=SIZE,
                 num_classes=CLASSES, labels=None, model_args=switches_)
    model = keras_vit.pretrained("test_eva02_28.random")
    reference = timm_eva_forward(state, images(), "base", KINDS["base"]["reference"])
    assert relative_error(outputs(model, images()), reference) < 1e-4


def test_registry_lists_eva02_with_its_sources_values():
    from keras_vit.weights.pretrained import source_defaults

    entries = {e.name: e for e in keras_vit.list_weights("eva02*")}
    assert len(entries) == 16
    base = entries["eva02_base_patch14_448.mim_in22k_ft_in22k_in1k"]
    assert (base.image_size, base.num_classes, base.top1) == (448, 1000, 88.678)
    assert base.preprocessing == dict(
        mean=[0.48145466, 0.4578275, 0.40821073], std=[0.26862954, 0.26130258, 0.27577711],
        interpolation="bicubic", antialias=True, crop_fraction=None)  # crop_mode="squash"
    tiny = entries["eva02_tiny_patch14_224.mim_in22k"]
    assert tiny.build_args() == dict(
        image_size=224, num_classes=0, patch_size=14, hidden_dim=192, num_heads=3,
        num_layers=12, mlp_dim=512, mlp="swiglu", rope=True, rope_reference_grid=(16, 16),
        classifier="avg", fc_norm=True, include_top=False, preprocessing=tiny.preprocessing)
    filled = source_defaults("eva02_large_patch14_448.mim_m38m_ft_in22k", {"image_size": 448})
    assert (filled["mlp_dim"], filled["num_layers"], filled["mlp_norm"], filled["num_classes"]) == (
        2730, 24, True, 21841)


FAMILY = {
    "small": {k: v for k, v in switches("small").items() if k != "mlp_norm"},
    "base": switches("base", dynamic_image_size=True),
}


@pytest.mark.parametrize("name", FAMILY)
def test_family_contract(name, tmp_path):
    check_family_contract(FAMILY[name], tmp_path)


def test_paper_vit_config_has_no_eva_keys():
    config = keras_vit.ViT(image_size=SIZE, patch_size=PATCH, hidden_dim=WIDTH, num_layers=1,
                           num_heads=HEADS, mlp_dim=MLP).get_config()
    assert not set(config) & {"rope", "rope_reference_grid", "mlp_norm", "fc_norm"}


def test_feature_maps_attention_maps_and_lora(timm_files):
    """The maps leave out the class token; attention maps and rollout come from the
    rotated attention; LoRA adapts the blocks and keeps the outputs until trained."""
    from keras_vit.training.lora import enable_lora

    model = keras_vit.ViT(image_size=SIZE, patch_size=PATCH, hidden_dim=WIDTH, num_layers=LAYERS,
                          num_heads=HEADS, mlp_dim=MLP, num_classes=CLASSES,
                          **switches("base", include_top=False, pooling=False))
    keras_vit.load_pretrained(model, timm_files["base"][0], strict=False)
    pixels = images()
    tokens = keras.ops.convert_to_numpy(model(pixels))
    assert tokens.shape == (2, 17, WIDTH)
    assert_maps_leave_out_prefix(model, pixels, outputs(model, pixels)[-1], 1)

    classifier = eva("base")
    keras_vit.load_pretrained(classifier, timm_files["base"][0])
    before = keras.ops.convert_to_numpy(classifier(pixels))
    enable_lora(classifier, 2)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(classifier(pixels)), before, atol=1e-5)
    assert any("lora" in v.path for v in classifier.trainable_weights)


def test_fewshot_takes_timms_pre_logits_and_scores_their_ridge(timm_files):
    """Few-shot features of an EVA-02 classifier (avg pooling, fc_norm) are timm's
    pre-logits: the patch mean through fc_norm, not the tokens' mean before it; the
    linear evaluation on them (every train image a shot) scores as the closed-form
    ridge written out in numpy does on timm's features."""
    from keras_vit.evaluation import fewshot

    path, state = timm_files["base"]
    model = eva("base")
    keras_vit.load_pretrained(model, path)
    pixels, labels = images(seed=5, count=12), np.arange(12) % 3
    features, got = fewshot.extract_features(model, pixels, labels, batch_size=5)
    tokens = timm_eva_forward(state, pixels, "base", KINDS["base"]["reference"])[-1]
    reference = timm_pre_logits(state, tokens).numpy().astype("float64")
    assert relative_error([features], [reference]) < 1e-4
    np.testing.assert_array_equal(got, labels)

    result = fewshot.evaluate_model(model, (pixels[:6], labels[:6]), (pixels[6:], labels[6:]),
                                    shots=(2,), seeds=[0], l2=1.0)
    x, x_test = whitened_with_bias(reference[:6], reference[6:])
    targets = 2.0 * np.eye(3)[labels[:6]] - 1.0
    weights = np.linalg.solve(x.T @ x + np.eye(x.shape[1]), x.T @ targets)
    assert result["accuracy"] == [[np.mean((x_test @ weights).argmax(1) == labels[6:])]]


@pytest.mark.parametrize("arguments, message", [
    (dict(rope_reference_grid=(16, 16)), "rope_reference_grid .* needs rope=True"),
    (dict(rope=True, num_heads=16), "multiple of 4, got 2"),
    (dict(rope="yes"), "rope must be True, False or a rotary embedding layer's config .*got 'yes'"),
    (dict(rope=True, rope_reference_grid=(0, 16)), "rope_reference_grid must be a positive int"),
])
def test_bad_switches_are_named(arguments, message):
    kwargs = dict(image_size=SIZE, patch_size=PATCH, hidden_dim=WIDTH, num_layers=1,
                  num_heads=HEADS, mlp_dim=MLP)
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT(**{**kwargs, **arguments})


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="exported from TensorFlow or JAX")
def test_saved_model_export_serves_an_eva02_at_any_size(timm_files, tmp_path):
    """A dynamic EVA-02 exported with `native_resolution` serves another size as the Keras
    model computes it (the rotary table and position table inside the SavedModel)."""
    import tensorflow as tf

    model = eva("base", dynamic_image_size=True)
    keras_vit.load_pretrained(model, timm_files["base"][0])
    keras_vit.export_saved_model(model, tmp_path / "export", native_resolution=True)
    served = tf.saved_model.load(str(tmp_path / "export")).signatures["logits"]
    pixels = np.random.default_rng(4).uniform(0, 255, (2, 42, 35, 3)).astype("float32")
    expected = keras.ops.convert_to_numpy(model(keras_vit.preprocess(pixels)))
    np.testing.assert_allclose(served(images=tf.constant(pixels))["logits"].numpy(), expected,
                               rtol=0, atol=1e-5 * np.abs(expected).max())


def test_onnx_export_of_an_eva02_matches_keras(timm_files, tmp_path):
    """EVA-02's rotary attention, SwiGLU with its norm and fc_norm, exported to ONNX on
    this backend and run by onnxruntime."""
    pytest.importorskip("onnxruntime")
    from keras_vit.export.onnx import check_onnx, export_onnx
    from keras_vit.export.records import TOLERANCE

    model = eva("base")
    keras_vit.load_pretrained(model, timm_files["base"][0])
    export_onnx(model, tmp_path / "eva.onnx")
    assert check_onnx(model, tmp_path / "eva.onnx", batch_size=2) <= TOLERANCE


def test_masked_patch_prediction_refuses_a_rope_encoder():
    encoder = keras_vit.ViT(image_size=SIZE, patch_size=PATCH, hidden_dim=WIDTH, num_layers=1,
                            num_heads=HEADS, mlp_dim=MLP, rope=True, include_top=False)
    with pytest.raises(ValueError, match="built with rope=True .*without rope"):
        keras_vit.MaskedPatchPrediction(encoder)


@pytest.mark.slow
def test_engine_fine_tuning_from_a_timm_eva02_file_resets_the_head(timm_files, tmp_path, caplog):
    """The engine fine-tunes an EVA-02 from its timm file: its head (6 classes) reset to
    zeros for the recipe's 5, the rest loaded."""
    arch = dict(patch_size=PATCH, hidden_dim=WIDTH, num_layers=LAYERS, num_heads=HEADS,
                mlp_dim=MLP, **switches("base"))
    result = fine_tune(timm_files["base"][0], arch, SIZE, tmp_path / "run", caplog)
    reset = f"the checkpoint's head has {CLASSES} classes, the model 5: the head is reset"
    assert reset in caplog.text
    parts = keras_vit.vit_parts(result.model)
    assert parts.rope is not None and tuple(parts.head.kernel.shape) == (WIDTH, 5)
