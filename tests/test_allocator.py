"""keras_vit.allocator: freed memory is reused without page faults under JAX and PyTorch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_environment

from keras_vit.utils.allocator import GLIBC, configure_for_backend

ROOT = Path(__file__).resolve().parents[1]
BLOCK_MIB = 256
PAGES = BLOCK_MIB * 256  # 4 KiB pages
# Past 2 GiB, the most that a trim threshold other than "never" can hold off
# (a ViT-S/16 training step under JAX frees about 4 GiB at once).
LARGE_BLOCK_MIB = 2304

pytestmark = pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")

# Mallocs, fills and frees a block twice; prints the page faults of the second time.
PROBE = """
import ctypes, resource
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
size = {mib} << 20
def fill_and_free():
    block = libc.malloc(size)
    libc.memset(block, 1, size)
    libc.free(block)
fill_and_free()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
fill_and_free()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _second_fill_faults(setup, mib=BLOCK_MIB, python=sys.executable, environ=None, cwd=None,
                        **env):
    """Page faults of the probe's second fill, run by `python` in the folder `cwd`, in
    `environ` (default: this environment with this checkout first) plus `env` (a None
    value removes it)."""
    environ = {**(environ or {**os.environ, "PYTHONPATH": str(ROOT)}),
               "TF_CPP_MIN_LOG_LEVEL": "3", **env}
    for name in [name for name, value in env.items() if value is None]:
        environ.pop(name)
    result = subprocess.run(
        [str(python), "-c", setup + "\n" + PROBE.format(mib=mib)],
        capture_output=True, text=True, env=environ, cwd=cwd, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return int(result.stdout.split()[-1])


def test_glibc_returns_a_freed_large_block_and_faults_it_in_again():
    # The baseline the allocator module exists for: every page faults again.
    assert _second_fill_faults("") >= PAGES // 2


def test_keep_freed_memory_reuses_even_a_block_past_2_gib_without_faults():
    setup = "from keras_vit.utils.allocator import keep_freed_memory\nassert keep_freed_memory()"
    assert _second_fill_faults(setup, mib=LARGE_BLOCK_MIB) < PAGES // 100


@pytest.mark.parametrize(
    "backend, choice, kept",
    [("jax", None, True), ("jax", "system", False), ("tensorflow", None, False),
     ("torch", None, True), ("torch", "system", False), ("torch", "keep", True)],
)
def test_opting_in_keeps_freed_memory_under_jax_and_torch(
        installed, tmp_path, backend, choice, kept):
    # As a user meets it: the built wheel's Python, an empty HOME, no other KERAS_VIT_*.
    faults = _second_fill_faults(
        "import keras_vit\nkeras_vit.configure_for_backend()", python=installed / "python",
        environ=clean_environment(HOME=str(tmp_path)), cwd=tmp_path, KERAS_BACKEND=backend,
        KERAS_VIT_MALLOC=choice,
    )
    assert (faults < PAGES // 100) == kept, faults


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_importing_keras_vit_leaves_malloc_alone(installed, tmp_path, backend):
    """A library import changes nothing process-wide, even where opting in would."""
    faults = _second_fill_faults(
        "import keras_vit\nkeras_vit.ViT", python=installed / "python",
        environ=clean_environment(HOME=str(tmp_path)), cwd=tmp_path, KERAS_BACKEND=backend,
        KERAS_VIT_MALLOC="keep",
    )
    assert faults >= PAGES // 2, faults


def test_the_command_opts_in_when_it_starts_the_backend():
    faults = _second_fill_faults("from keras_vit import cli\ncli.start_backend()",
                                 KERAS_BACKEND="jax", KERAS_VIT_MALLOC=None)
    assert faults < PAGES // 100, faults


def test_unknown_malloc_choice_is_refused_with_its_value(monkeypatch):
    monkeypatch.setenv("KERAS_VIT_MALLOC", "tcmalloc")
    with pytest.raises(ValueError, match="KERAS_VIT_MALLOC='tcmalloc'.*'keep', 'system'"):
        configure_for_backend("jax")
