"""DeiT and DeiT III on the one `keras_vit.ViT`: numerics against HF transformers and
timm's formulas, on every Keras backend.

The references are tiny randomly initialised HF `DeiTForImageClassificationWithTeacher`
and `DeiTForImageClassification` models saved with `save_pretrained` (nothing downloads),
and, for DeiT III (which HF lacks), timm's block `x + gamma * f(x)` with its
`no_embed_class` embedding written out below in torch. Each comparison takes the logits
and every block's output tokens, within 1e-4 of their largest magnitude, in float32.
The module runs on the current backend; tests/test_backends_*.py runs it on the others.
"""

import math
import os
import re

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import DeiTConfig, DeiTForImageClassification, DeiTForImageClassificationWithTeacher

import keras_vit
from family_contract import (
    IMAGES, as_numpy, assert_maps_leave_out_prefix, check_family_contract, fine_tune, outputs,
    relative_error,
)
from references import randomise, random_timm_state, timm_from_hf

LAYERS, WIDTH, HEADS, CLASSES = 2, 32, 4, 10
HF_CONFIG = dict(
    hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
    intermediate_size=64, image_size=32, patch_size=8, num_labels=CLASSES,
)  # layer_norm_eps left at DeiTConfig's 1e-12
TINY = dict(image_size=32, patch_size=8, hidden_dim=WIDTH, num_layers=LAYERS, num_heads=HEADS,
            mlp_dim=64, num_classes=CLASSES)



def hf_reference(model_class, directory):
    """A randomised HF DeiT saved in `directory`, and its logits and block outputs."""
    model = randomise(model_class(DeiTConfig(**HF_CONFIG)), seed=3)
    model.save_pretrained(directory)
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(IMAGES.transpose(0, 3, 1, 2)),
                    output_hidden_states=True)
    # hidden_states: the embeddings, then each block's output (before the final norm).
    return [out.logits.numpy(), *(h.numpy() for h in out.hidden_states[1:])]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    directory = tmp_path_factory.mktemp("deit_teacher")
    return directory, hf_reference(DeiTForImageClassificationWithTeacher, directory)


@pytest.fixture(scope="module")
def single_head(tmp_path_factory):
    directory = tmp_path_factory.mktemp("deit_single")
    return directory, hf_reference(DeiTForImageClassification, directory)


def test_hf_teacher_directory_builds_and_matches_transformers(teacher):
    directory, reference = teacher
    model = keras_vit.pretrained(directory)  # from config.json: no constructor arguments
    config = model.get_config()
    assert config["distilled"] and config["layer_norm_epsilon"] == 1e-12
    assert "distillation_head" not in config  # the default: both heads, averaged
    assert relative_error(outputs(model), reference) < 1e-4


def test_vit_weights_from_an_hf_directory_fine_tunes_with_both_heads_reset(teacher):
    """ViT(weights=HF_DIR) takes the architecture from config.json, as for a registry name."""
    directory = teacher[0]
    model = keras_vit.ViT(weights=directory, num_classes=5, image_size=48)
    config = model.get_config()
    assert (config["distilled"], config["layer_norm_epsilon"], config["hidden_dim"]) == (True, 1e-12, WIDTH)
    for head in keras_vit.vit_parts(model).heads:
        assert head.kernel.shape == (WIDTH, 5) and not np.any(as_numpy(head.kernel))
    with pytest.raises(ValueError, match=r"takes num_classes from .*config.json.*"
                       r"keras_vit.ViT\(weights=.*num_classes=\.\.\.\)"):
        keras_vit.pretrained(directory, num_classes=5)


@pytest.mark.parametrize("model_class, config_class, output", [
    ("ViTForImageClassification", "ViTConfig", "logits"),
    ("ViTModel", "ViTConfig", "pooler_output"),
    ("DeiTModel", "DeiTConfig", "pooler_output"),
])
def test_pretrained_builds_each_hf_architecture_from_its_config(model_class, config_class,
                                                                output, tmp_path):
    import transformers

    config = getattr(transformers, config_class)(**HF_CONFIG, hidden_act="gelu_pytorch_tanh")
    hf = randomise(getattr(transformers, model_class)(config), seed=4)
    hf.save_pretrained(tmp_path)
    with torch.no_grad():
        expected = getattr(hf(pixel_values=torch.from_numpy(IMAGES.transpose(0, 3, 1, 2))), output)
    model = keras_vit.pretrained(tmp_path)
    assert model.get_config()["gelu_approximate"] is True
    assert relative_error([as_numpy(model(IMAGES))], [expected.numpy()]) < 1e-4


def test_a_folder_without_a_transformers_model_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"is not an HF transformers model directory: .*"
                       r"config.json and model.safetensors"):
        keras_vit.pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "config.json").write_text('{"architectures": ["SwinModel"]}')
    with pytest.raises(ValueError, match=r"describes a 'SwinModel' model: keras-vit "
                       r"builds ViTForImageClassification"):
        keras_vit.pretrained(tmp_path)


def test_hf_single_head_deit_classifies_the_class_token(single_head):
    directory, reference = single_head
    model = keras_vit.pretrained(directory)
    assert model.get_config()["distillation_head"] is False
    assert keras_vit.vit_parts(model).head_dist is None
    assert relative_error(outputs(model), reference) < 1e-4


def test_negative_control_flipped_switches_miss_the_reference(teacher):
    """The comparison can fail: the same weights with the heads not averaged (the class
    token's head alone) miss HF's logits, though every block matches."""
    directory, reference = teacher
    one_head = keras_vit.ViT(**TINY, distilled=True, distillation_head=False,
                             layer_norm_epsilon=1e-12)
    with pytest.raises(ValueError, match=r"has a distillation head 'head_dist'.*"
                       r"distillation_head=True"):
        keras_vit.load_pretrained(one_head, directory)
    report = keras_vit.load_pretrained(one_head, directory, strict=False)
    assert report.unexpected == ["head_dist/bias", "head_dist/kernel"]
    ours = outputs(one_head)
    assert relative_error(ours[1:], reference[1:]) < 1e-4  # the same encoder
    assert relative_error(ours[:1], reference[:1]) > 1e-2  # not its logits


def timm_distilled_from_hf(files):
    """HF DeiT teacher tensors -> timm's VisionTransformerDistilled state dict: the
    ViT's tensors as `references.timm_from_hf` converts them, the distillation token and
    head."""
    as_vit = {re.sub(r"^deit\.", "vit.", key).replace("cls_classifier", "classifier"): value
              for key, value in files.items()}
    state = timm_from_hf(as_vit)
    state["dist_token"] = files["deit.embeddings.distillation_token"]
    for p in ("weight", "bias"):
        state[f"head_dist.{p}"] = files[f"distillation_classifier.{p}"]
    return state


def test_timm_distilled_safetensors_match_transformers(teacher, tmp_path):
    directory, reference = teacher
    save_file(timm_distilled_from_hf(load_file(directory / "model.safetensors")), tmp_path / "t.safetensors")
    model = keras_vit.ViT(**TINY, distilled=True, layer_norm_epsilon=1e-12)
    report = keras_vit.load_pretrained(model, tmp_path / "t.safetensors")
    assert report.format == "timm" and not report.messages
    assert relative_error(outputs(model), reference) < 1e-4


# --- DeiT III: layer scale and no_embed_class, against timm's formulas -----------------


def deit3_state(seed=5):
    """A random timm DeiT III state dict (`no_embed_class`: a table of the patches only;
    `ls1.gamma`, `ls2.gamma`), not near layer scale's 1e-6 start, so that it shows."""
    def block(normal, b):
        return {
            b + "attn.qkv.weight": normal(3 * WIDTH, WIDTH), b + "attn.qkv.bias": normal(3 * WIDTH),
            b + "ls1.gamma": normal(WIDTH, mean=0.5), b + "ls2.gamma": normal(WIDTH, mean=0.5),
            b + "mlp.fc1.weight": normal(64, WIDTH), b + "mlp.fc1.bias": normal(64),
        }

    return random_timm_state(seed, width=WIDTH, layers=LAYERS, classes=CLASSES, patch=8,
                             positions=(32 // 8) ** 2, mlp_dim=64, final_norm="norm",
                             block=block)


def timm_deit3_forward(state, images):
    """timm's VisionTransformer with no_embed_class and LayerScale, from its formulas:
    the logits and each block's output."""
    w = {k: torch.from_numpy(v) for k, v in state.items()}
    F = torch.nn.functional
    x = F.conv2d(torch.from_numpy(images.transpose(0, 3, 1, 2)), w["patch_embed.proj.weight"],
                 w["patch_embed.proj.bias"], stride=8)
    x = x.flatten(2).transpose(1, 2) + w["pos_embed"]  # no_embed_class: add, then concat
    x = torch.cat([w["cls_token"].expand(len(x), -1, -1), x], dim=1)
    blocks = []
    for i in range(LAYERS):
        b = f"blocks.{i}."

        def norm(t, name, b=b):
            return F.layer_norm(t, (WIDTH,), w[f"{b}{name}.weight"], w[f"{b}{name}.bias"], 1e-6)

        q, k, v = F.linear(norm(x, "norm1"), w[b + "attn.qkv.weight"], w[b + "attn.qkv.bias"]).chunk(3, -1)
        q, k, v = (t.unflatten(-1, (HEADS, -1)).transpose(1, 2) for t in (q, k, v))
        attention = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(WIDTH // HEADS), -1)
        attended = F.linear((attention @ v).transpose(1, 2).flatten(2),
                            w[b + "attn.proj.weight"], w[b + "attn.proj.bias"])
        x = x + w[b + "ls1.gamma"] * attended
        hidden = F.gelu(F.linear(norm(x, "norm2"), w[b + "mlp.fc1.weight"], w[b + "mlp.fc1.bias"]))
        x = x + w[b + "ls2.gamma"] * F.linear(hidden, w[b + "mlp.fc2.weight"], w[b + "mlp.fc2.bias"])
        blocks.append(x.numpy())
    x = F.layer_norm(x, (WIDTH,), w["norm.weight"], w["norm.bias"], 1e-6)
    return [F.linear(x[:, 0], w["head.weight"], w["head.bias"]).numpy(), *blocks]


@pytest.fixture(scope="module")
def deit3(tmp_path_factory):
    path = tmp_path_factory.mktemp("deit3") / "model.safetensors"
    state = deit3_state()
    save_file(state, path)
    return path, timm_deit3_forward(state, IMAGES)


def test_timm_deit3_layer_scale_matches_timms_formula(deit3):
    path, reference = deit3
    model = keras_vit.ViT(**TINY, no_embed_class=True, layer_scale_init=1e-6)
    report = keras_vit.load_pretrained(model, path)
    assert report.format == "timm" and report.messages == [
        "timm's no_embed_class model adds no position embedding to the class token: its "
        "position row is set to zero."
    ]
    assert relative_error(outputs(model), reference) < 1e-4


def test_negative_control_deit3_without_layer_scale_misses_timm(deit3):
    path, reference = deit3
    model = keras_vit.ViT(**TINY, no_embed_class=True)
    with pytest.raises(ValueError, match=r"has layer scale \(DeiT III\).*layer_scale_init=1e-6"):
        keras_vit.load_pretrained(model, path)
    keras_vit.load_pretrained(model, path, strict=False)
    assert relative_error(outputs(model), reference) > 1e-2


def test_a_class_token_position_into_a_no_embed_class_model_is_refused(teacher):
    model = keras_vit.ViT(**TINY, distilled=True, no_embed_class=True)
    with pytest.raises(ValueError, match=r"position embedding for the token 'cls'.*"
                       r"no_embed_class=False"):
        keras_vit.load_pretrained(model, teacher[0])


# --- the model's own round trips -------------------------------------------------------

FAMILY = {
    "deit_teacher": dict(distilled=True, layer_norm_epsilon=1e-12),
    "deit_single_head": dict(distilled=True, distillation_head=False),
    "deit3": dict(no_embed_class=True, layer_scale_init=1e-6),
    "deit3_distilled": dict(distilled=True, no_embed_class=True, layer_scale_init=0.1),
}



@pytest.mark.parametrize("name", FAMILY)
def test_family_contract(name, tmp_path):
    check_family_contract(FAMILY[name], tmp_path)


def test_paper_vit_config_has_no_family_keys():
    """The paper's ViT records none of the new switches: its configs and `.keras` files
    stay as keras-vit wrote them before."""
    config = keras_vit.ViT(**TINY).get_config()
    assert not set(config) & {"distilled", "distillation_head", "no_embed_class",
                              "layer_scale_init", "layer_norm_epsilon"}


def test_headless_distilled_model_pools_the_mean_of_both_tokens(teacher):
    """timm's `pre_logits` of a distilled model: (class token + distillation token) / 2."""
    model = keras_vit.ViT(**TINY, distilled=True, layer_norm_epsilon=1e-12, include_top=False)
    keras_vit.load_pretrained(model, teacher[0])
    tokens = keras_vit.ViT(**TINY, distilled=True, layer_norm_epsilon=1e-12, include_top=False,
                           pooling=False)
    keras_vit.load_pretrained(tokens, teacher[0])
    every = as_numpy(tokens(IMAGES))
    np.testing.assert_allclose(as_numpy(model(IMAGES)), (every[:, 0] + every[:, 1]) / 2, atol=1e-6)



def test_feature_maps_attention_maps_and_lora_of_a_distilled_model(teacher):
    """The patch maps leave out both prefix tokens; the attention map is the class
    token's row over the patches; LoRA trains both heads."""
    from keras_vit.training.lora import enable_lora

    model = keras_vit.ViT(**TINY, distilled=True, layer_norm_epsilon=1e-12)
    keras_vit.load_pretrained(model, teacher[0])
    assert_maps_leave_out_prefix(model, IMAGES, outputs(model)[-1], 2)

    enable_lora(model, 2)
    trainable = {v.path for v in model.trainable_weights}
    assert {"head/kernel", "head_dist/kernel", "head/bias", "head_dist/bias"} <= trainable



@pytest.mark.parametrize("arguments, message", [
    (dict(distilled=True, classifier="gap"), "distilled=True adds a distillation token"),
    (dict(distillation_head=False), "distillation_head=False .* needs distilled=True"),
    (dict(no_embed_class=True, classifier="gap"), "no_embed_class=True .* classifier='gap'"),
    (dict(layer_scale_init="small"), "layer_scale_init must be None or a number .* 'small'"),
    (dict(layer_norm_epsilon=0), "layer_norm_epsilon must be a positive number, got 0"),
    (dict(distilled=True, representation_size=16), "representation_size .* distillation_head=False"),
])
def test_bad_family_switches_are_named(arguments, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT(**TINY, **arguments)


# --- registry and fine-tuning ------------------------------------------------------------


def test_registry_lists_deit_checkpoints_with_their_switches_and_reported_top1():
    from keras_vit.weights import registry
    from keras_vit.weights.pretrained import source_defaults

    entries = {e.name: e for e in keras_vit.list_weights("deit")}
    assert len(entries) == 24
    # facebookresearch/deit README_deit.md and README_revenge.md
    assert {name: entries[name].top1 for name in (
        "deit_tiny_patch16_224.fb_in1k", "deit_small_distilled_patch16_224.fb_in1k",
        "deit3_base_patch16_224.fb_in22k_ft_in1k",
    )} == {"deit_tiny_patch16_224.fb_in1k": 72.2,
           "deit_small_distilled_patch16_224.fb_in1k": 81.2,
           "deit3_base_patch16_224.fb_in22k_ft_in1k": 85.7}
    entry = entries["deit_base_distilled_patch16_384.fb_in1k"]
    assert entry.url == registry.TIMM_HUB.format(name=entry.name)
    # What ViT(weights=NAME) takes from the entry: the architecture and its switches.
    assert source_defaults("deit3_large_patch16_384.fb_in1k", {"num_classes": 5}) == dict(
        variant="L/16", image_size=384, num_classes=5, no_embed_class=True, layer_scale_init=1e-6,
    )


def test_an_hf_model_folder_is_a_from_source_not_a_run_folder(teacher):
    """Its config.json (the transformers model's) made --from take it for an unfinished
    keras-vit run ("has neither model.keras nor a checkpoint")."""
    from keras_vit.training import runs

    directory = str(teacher[0])
    assert runs.resolve_from(directory).path == directory
    assert runs.run_config(os.path.join(directory, "model.safetensors")) is None
    message = runs.load_weights(keras_vit.ViT(**TINY, distilled=True), directory)
    assert message.startswith(f"loaded {directory}:")


@pytest.mark.slow
def test_engine_fine_tuning_from_a_deit_source_resets_both_heads(teacher, tmp_path, caplog):
    arch = dict(patch_size=8, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=64,
                distilled=True, layer_norm_epsilon=1e-12)
    result = fine_tune(teacher[0], arch, 16, tmp_path / "run", caplog)
    for head in ("head", "head_dist"):
        assert (f"the checkpoint's {head} has {CLASSES} classes, the model 5: the {head} is "
                "reset to zeros.") in caplog.text
    parts = keras_vit.vit_parts(result.model)
    assert parts.head_dist is not None and parts.head_dist.kernel.shape == (WIDTH, 5)
