"""FLOP counts, checked against PyTorch's FlopCounterMode on HF transformers' ViT."""

import keras
import pytest

import keras_vit
from keras_vit.models.flops import forward_flops

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402


def _hf_flops(image_size, patch_size, hidden_dim, num_layers, num_heads, mlp_dim, num_classes):
    config = transformers.ViTConfig(
        image_size=image_size, patch_size=patch_size, hidden_size=hidden_dim,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        intermediate_size=mlp_dim, num_labels=num_classes, attn_implementation="eager",
    )
    model = transformers.ViTForImageClassification(config).eval()
    images = torch.zeros(1, 3, image_size, image_size)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(pixel_values=images)
    return counter.get_total_flops()


@pytest.mark.parametrize("image_size, patch_size", [(32, 8), (48, 4)])
def test_forward_flops_equal_torch_flop_counter_on_hf_vit(image_size, patch_size):
    arch = dict(hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=64, num_classes=10)
    with keras.StatelessScope():
        model = keras_vit.ViT(image_size=image_size, patch_size=patch_size, **arch)
    assert forward_flops(model) == _hf_flops(image_size, patch_size, **arch)


def test_forward_flops_count_gap_pooling_and_pre_logits_in_closed_form():
    arch = dict(image_size=32, patch_size=8, hidden_dim=32, num_layers=2, num_heads=4, mlp_dim=64)
    with keras.StatelessScope():
        token = forward_flops(keras_vit.ViT(num_classes=10, **arch))
        gap = forward_flops(keras_vit.ViT(num_classes=10, classifier="gap", **arch))
        pre = forward_flops(keras_vit.ViT(num_classes=10, representation_size=24, **arch))
    # One token fewer in each of the 2 blocks: 16 patches instead of 17 tokens.
    per_token = 2 * (32 * 96 + 32 * 32 + 2 * 32 * 64)
    attention = lambda n: 4 * n * n * 32
    assert token - gap == 2 * (per_token + attention(17) - attention(16))
    assert pre - token == 2 * 32 * 24 + 2 * 24 * 10 - 2 * 32 * 10
