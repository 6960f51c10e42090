"""Runs the layer, model and family tests (helpers.MULTI_BACKEND_TESTS) under PyTorch.

A module per backend, so that the two runs can go to the suite's two workers at once.
"""

import pytest

from helpers import run_multi_backend_tests

pytestmark = pytest.mark.slow  # a pytest run in a subprocess


def test_layer_model_and_family_tests_pass_on_torch():
    run_multi_backend_tests("torch")
