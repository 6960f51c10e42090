"""On PyTorch a `keras_vit.ViT` calls its layers through their own `call` where that
computes what Keras' `Layer.__call__` computes (`keras_vit.backend.calls.call_sublayer`,
`VisionTransformer.call`).

The reference is the same model with a PyTorch forward hook on every module: `call_sublayer`
then calls each layer through `Layer.__call__`, which runs the hook. The outputs are equal
bit for bit, for the paper's ViT, DINOv3's switches, EVA-02's, SigLIP's and a hybrid's
(whose layers under `mixed_bfloat16` need the check that their inputs are in their
compute dtype), in float32 and under `mixed_bfloat16`, at inference and in training; and
for a quantized model, whose int8 layers keep Keras' call. A hook on one layer runs, and
a block Keras rematerialises runs through Keras' rematerialised call in training.

PyTorch only (the module is skipped elsewhere): tests/test_backends_torch.py runs it under
KERAS_BACKEND=torch.
"""

import contextlib

import keras
import numpy as np
import pytest

from keras_vit.families import dinov3
from family_contract import IMAGES, TINY, as_numpy, randomised

pytestmark = [
    pytest.mark.skipif(
        keras.backend.backend() != "torch", reason="Layer.__call__ is bypassed on PyTorch only"
    ),
    pytest.mark.every_backend,
]

SWITCHES = {
    "vit": {},
    "dinov3": {k: v for k, v in dinov3.SWITCHES.items() if k != "include_top"},
    "eva02": dict(mlp="swiglu", rope=True, rope_reference_grid=(3, 2), classifier="avg",
                  fc_norm=True, mlp_norm=True),
    "siglip": dict(classifier="map", gelu_approximate=True),
    "hybrid": dict(resnet_stages=(1,)),
}


@contextlib.contextmanager
def hook_on_every_module(called):
    """A PyTorch forward hook on every module, recording each module it runs for."""
    import torch

    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, output: called.append(module)
    )
    try:
        yield
    finally:
        handle.remove()


def graph_layers(model):
    return [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]


def assert_calls_compute_what_keras_computes(model):
    for training in (None, False, True):
        direct = as_numpy(model(IMAGES, training=training))
        called = []
        with hook_on_every_module(called):
            through_keras = as_numpy(model(IMAGES, training=training))
        np.testing.assert_array_equal(direct, through_keras, err_msg=f"training={training}")
        assert {id(layer) for layer in graph_layers(model)} <= set(map(id, called))


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("family", SWITCHES)
def test_layers_through_their_call_compute_what_keras_call_computes(family, policy):
    keras.config.set_dtype_policy(policy)
    model = randomised(**SWITCHES[family])
    assert_calls_compute_what_keras_computes(model)


def test_a_quantized_model_computes_what_keras_call_computes():
    model = randomised()
    model.quantize("int8")
    assert_calls_compute_what_keras_computes(model)


def test_a_hook_on_one_layer_runs_at_each_call():
    model = randomised()
    block = model.parts.blocks[0]
    seen = []
    handle = block.register_forward_hook(lambda module, args, output: seen.append(output))
    try:
        outputs = [model(IMAGES), model(IMAGES, training=False)]
    finally:
        handle.remove()
    assert len(seen) == 2
    np.testing.assert_array_equal(as_numpy(outputs[0]), as_numpy(outputs[1]))


def test_blocks_keras_rematerialises_take_its_call_in_training():
    model = randomised(remat=True)
    rematerialised = []
    for block in model.parts.blocks:
        call = block.rematerialized_call

        def counted(*args, _call=call, **kwargs):
            rematerialised.append(args[0])
            return _call(*args, **kwargs)

        block.rematerialized_call = counted
    model(IMAGES, training=True)
    assert len(rematerialised) == TINY["num_layers"]
