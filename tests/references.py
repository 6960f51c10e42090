"""Peer references the tests compare keras-vit with, written independently of it:
randomised HF (PyTorch) modules, timm state dicts built from HF tensors or drawn at
random, big_vision's few-shot preprocessing in NumPy."""

import numpy as np
import torch


def randomise(module, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = 0.3 * torch.randn(param.shape, generator=generator)
            is_norm_scale = "layernorm" in name and name.endswith("weight")
            param.copy_(noise + (1.0 if is_norm_scale else 0.0))
    return module.eval()


def timm_from_hf(w):
    """HF ViT file tensors -> a timm VisionTransformer state dict (the same tensors under
    timm's names, q, k and v fused)."""
    layers = len({k.split(".")[3] for k in w if k.startswith("vit.encoder.layer.")})
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


def whitened_with_bias(train, test):
    """big_vision's preprocessing, written out independently of keras_vit."""
    mean, std = train.mean(0), train.std(0) + 1e-5
    add_bias = lambda x: np.hstack([(x - mean) / std, np.full((len(x), 1), 100.0)])
    return add_bias(train), add_bias(test)
