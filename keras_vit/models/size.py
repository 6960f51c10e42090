"""The memory a ViT needs, from its architecture arguments, before any of it is built.

A model far too large for the machine (`num_layers=100000000`) would otherwise grow the
process's memory layer by layer until the system stops it. `ViT(...)` checks its
weights, and a training run (`keras_vit.training.engine`) its weights, their gradients
and optimizer state, and a micro-batch's activations, against the memory the machine
has available; what cannot fit is refused with the estimate. The estimates are lower
bounds (a plain ViT's matrices and the activations the backward pass must keep), so a
model refused cannot fit; one accepted may still need more.
"""

import os
import shutil
import subprocess

GB = 1e9


def parameter_count(*, tokens, patch_values, hidden_dim, mlp_dim, num_layers, num_classes):
    """The weights of a ViT with a class token, learned positions and `num_classes`
    outputs (a hybrid's ResNet trunk and the families' extra parts not counted).

    Args:
        tokens: patches per image, plus the class token.
        patch_values: values per patch (patch size squared times channels; 0 for a
            hybrid, whose patch embedding is on the trunk's features).
        hidden_dim, mlp_dim, num_layers: the encoder's width, MLP width and depth.
        num_classes: the head's outputs (0: no head).

    Returns:
        The number of parameters.

    Example (timm's `vit_base_patch16_224` has 86,567,656):

    >>> parameter_count(tokens=197, patch_values=16 * 16 * 3, hidden_dim=768,
    ...                 mlp_dim=3072, num_layers=12, num_classes=1000)
    86567656
    """
    width = hidden_dim
    # The patch projection, the position table and the class token.
    embedding = (patch_values + 1) * width + tokens * width + width
    # Two norms, the q, k, v and output projections, the two MLP layers (with biases).
    block = 4 * width * width + 2 * width * mlp_dim + 9 * width + mlp_dim
    head = (width + 1) * num_classes
    return embedding + num_layers * block + 2 * width + head


def activation_values(*, tokens, hidden_dim, mlp_dim, num_heads, num_layers, remat=False):
    """Values one image's forward pass keeps for the backward pass, at least: in each
    block the inputs of its four matrix products and the attention weights; with
    `remat`, only the blocks' inputs.

    Example:

    >>> activation_values(tokens=197, hidden_dim=768, mlp_dim=3072, num_heads=12,
    ...                   num_layers=12)
    18297360
    """
    if remat:
        return num_layers * tokens * hidden_dim
    per_block = 3 * tokens * hidden_dim + tokens * mlp_dim + num_heads * tokens * tokens
    return num_layers * per_block


def available_memory(needed=None):
    """Bytes the machine has available: the host's (`MemAvailable`), plus its NVIDIA
    GPUs' (`nvidia-smi`, asked only when `needed` bytes exceed the host's), where a model
    may live instead. None when it cannot be told (no `/proc/meminfo`, a TPU attached)."""
    host = _host_available()
    if host is None or os.environ.get("TPU_NAME") or os.path.exists("/dev/accel0"):
        return None
    if needed is not None and needed <= host:
        return host
    return host + _gpu_memory()


def _host_available():
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            return None


def _gpu_memory():
    """The total memory of the NVIDIA GPUs, in bytes (0 without any)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
        return sum(int(line) for line in listing.split()) * 2**20
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0


def check_fits(needed, what, advice):
    """Raises `ValueError` when `needed` bytes exceed what the machine has available,
    naming `what` needs them (with the estimate in GB) and `advice` (what to change)."""
    available = available_memory(needed)
    if available is not None and needed > available:
        raise ValueError(
            f"{what} needs at least {needed / GB:,.1f} GB, and this machine has "
            f"{available / GB:,.1f} GB available: {advice}"
        )
