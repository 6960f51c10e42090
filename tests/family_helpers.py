"""What the family tests share (DeiT, DINOv2, EVA-02, SigLIP and CLIP against their HF
and timm references): randomised references, timm state dicts, the tiny model and its
images, and the assertions every family's test makes.

A helper module, not a test module: test modules import it, never each other.
"""

import logging

import keras
import numpy as np
import torch

import keras_vit
from helpers import assert_keras_file_round_trip, randomise_weights

LAYERS, WIDTH, HEADS, CLASSES = 2, 32, 4, 10
TINY = dict(image_size=32, patch_size=8, hidden_dim=WIDTH, num_layers=LAYERS, num_heads=HEADS,
            mlp_dim=64, num_classes=CLASSES)


def randomise(module, seed):
    """The torch `module` with every parameter drawn at random (norm scales near 1), in
    eval mode: a lost or misplaced tensor then shows in the outputs."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = 0.3 * torch.randn(param.shape, generator=generator)
            is_norm_scale = "layernorm" in name and name.endswith("weight")
            param.copy_(noise + (1.0 if is_norm_scale else 0.0))
    return module.eval()


def as_numpy(x):
    return keras.ops.convert_to_numpy(x)


def timm_from_hf(w):
    """HF file tensors -> a timm VisionTransformer state dict."""
    out = {
        "cls_token": w["vit.embeddings.cls_token"],
        "pos_embed": w["vit.embeddings.position_embeddings"],
        "patch_embed.proj.weight": w["vit.embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": w["vit.embeddings.patch_embeddings.projection.bias"],
        "norm.weight": w["vit.layernorm.weight"],
        "norm.bias": w["vit.layernorm.bias"],
        "head.weight": w["classifier.weight"],
        "head.bias": w["classifier.bias"],
    }
    layers = len({key.split(".")[3] for key in w if key.startswith("vit.encoder.layer.")})
    for i in range(layers):
        hf, timm = f"vit.encoder.layer.{i}.", f"blocks.{i}."
        for p in ("weight", "bias"):
            qkv = [w[f"{hf}attention.attention.{n}.{p}"] for n in ("query", "key", "value")]
            out[f"{timm}attn.qkv.{p}"] = np.concatenate(qkv, axis=0)
            out[f"{timm}attn.proj.{p}"] = w[f"{hf}attention.output.dense.{p}"]
            out[f"{timm}norm1.{p}"] = w[f"{hf}layernorm_before.{p}"]
            out[f"{timm}norm2.{p}"] = w[f"{hf}layernorm_after.{p}"]
            out[f"{timm}mlp.fc1.{p}"] = w[f"{hf}intermediate.dense.{p}"]
            out[f"{timm}mlp.fc2.{p}"] = w[f"{hf}output.dense.{p}"]
    return out


IMAGES = np.random.default_rng(0).uniform(-1, 1, (3, 32, 32, 3)).astype("float32")


def outputs(model):
    """The model's logits and each block's output tokens, on `IMAGES`."""
    blocks = [block.output for block in keras_vit.vit_parts(model).blocks]
    probe = keras.Model(model.input, [model.output, *blocks])
    return [as_numpy(x) for x in probe(IMAGES)]


def relative_error(ours, reference):
    """The largest difference, over the largest magnitude of the reference."""
    return max(
        np.abs(a - b).max() / np.abs(b).max() for a, b in zip(ours, reference, strict=True)
    )


def random_timm_state(seed, *, width, layers, classes, patch, positions, mlp_dim, final_norm,
                      block):
    """A random timm ViT state dict: float32 draws of standard deviation 0.3 (norm weights
    near 1, no zero biases, so that a lost or misplaced tensor shows). Each block gets
    the entries every timm ViT has and `block(normal, prefix)`'s own (its attention
    projections, MLP input, layer scale); `final_norm` names the last norm (`norm`, or
    `fc_norm` after the pooling)."""
    rng = np.random.default_rng(seed)

    def normal(*shape, mean=0.0):
        return (mean + 0.3 * rng.standard_normal(shape)).astype("float32")

    state = {
        "cls_token": normal(1, 1, width), "pos_embed": normal(1, positions, width),
        "patch_embed.proj.weight": normal(width, 3, patch, patch),
        "patch_embed.proj.bias": normal(width),
        f"{final_norm}.weight": normal(width, mean=1.0), f"{final_norm}.bias": normal(width),
        "head.weight": normal(classes, width), "head.bias": normal(classes),
    }
    for i in range(layers):
        b = f"blocks.{i}."
        state.update({
            b + "norm1.weight": normal(width, mean=1.0), b + "norm1.bias": normal(width),
            b + "attn.proj.weight": normal(width, width), b + "attn.proj.bias": normal(width),
            b + "norm2.weight": normal(width, mean=1.0), b + "norm2.bias": normal(width),
            b + "mlp.fc2.weight": normal(width, mlp_dim), b + "mlp.fc2.bias": normal(width),
            **block(normal, b),
        })
    return state


def assert_family_round_trip(switches, path):
    """A tiny model with the family `switches` records them in its config, is rebuilt
    from it with the same weights, and comes back from a `.keras` file at `path`
    giving the same outputs."""
    model = keras_vit.ViT(**TINY, **switches)
    randomise_weights(model, seed=1)
    config = model.get_config()
    assert {key: config[key] for key in switches} == switches
    rebuilt = keras_vit.VisionTransformer.from_config(config)
    assert rebuilt.get_config() == config
    assert [w.path for w in rebuilt.weights] == [w.path for w in model.weights]
    assert_keras_file_round_trip(model, IMAGES, path)


def assert_maps_leave_out_prefix(model, images, last, prefix, prefix_tokens=None):
    """`feature_model`'s maps (4x4) are the last block's tokens after the `prefix` tokens
    in front of the patches, and its prefix output those; the attention map (told
    `prefix_tokens`) is the class token's rollout row over the patches. Returns the
    attention weights."""
    count = len(images)
    maps, tokens = keras_vit.feature_model(model, prefix_tokens=True)(images)
    assert tuple(maps.shape) == (count, 4, 4, WIDTH) and tuple(tokens.shape) == (count, prefix, WIDTH)
    np.testing.assert_array_equal(as_numpy(maps).reshape(count, 16, WIDTH), last[:, prefix:])
    np.testing.assert_array_equal(as_numpy(tokens), last[:, :prefix])

    _, attentions = keras_vit.attention_model(model)(images)
    rollout = keras_vit.attention_rollout(attentions)
    assert tuple(rollout.shape) == (count, 16 + prefix, 16 + prefix)
    np.testing.assert_array_equal(
        keras_vit.attention_map(rollout, (4, 4), prefix_tokens).reshape(count, 16),
        rollout[:, 0, prefix:],
    )
    return attentions


def assert_mixed_precision_near_float32(family):
    """A tiny model with the family switches gives float32 logits under mixed_bfloat16,
    within 5% of the float32 model's with the same weights."""
    reference = keras_vit.ViT(**TINY, **family)
    randomise_weights(reference, seed=2)
    mixed = keras_vit.ViT(**TINY, **family, dtype="mixed_bfloat16")
    mixed.set_weights(reference.get_weights())
    logits = mixed(IMAGES)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert relative_error([as_numpy(logits)], [as_numpy(reference(IMAGES))]) < 0.05


def fine_tune(source, kwargs, image_size, out, caplog):
    """The engine's one-epoch fine-tune of the demo recipe (5 digit classes) on a custom
    architecture `kwargs` (`model.kwargs`) from `source`; its `TrainResult`."""
    from keras_vit import cli
    from keras_vit.training.config import apply_overrides
    from keras_vit.training.engine import train

    config = apply_overrides(cli.load_recipe("demo"), [
        "model.variant=custom", f"model.kwargs={kwargs!r}", f"model.image_size={image_size}",
        "model.channels=3", f"model.init_from={source}", "data.classes=0-4",
        "schedule.epochs=1", "schedule.warmup_updates=2", "checkpointing.tensorboard=False",
        f"out={out}",
    ])
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        return train(config, verbose=0)
