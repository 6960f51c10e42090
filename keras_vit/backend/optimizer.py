"""Keras' optimizer step on PyTorch in fused and foreach kernels: the Adam update of
every variable in one pass, and the clip to a global norm.

Keras' PyTorch Adam updates the variables with ten `torch._foreach_*` calls, five of
which allocate a result the size of the model: each a pass over memory that a step
waits on. PyTorch's fused Adam kernel (`torch.optim.Adam(fused=True)`, what HF's
`Trainer` picks by default) reads each variable, gradient and moment once. Its rule
adds epsilon to the bias-corrected root of the second moment, Keras' to the root of the
uncorrected one; with epsilon divided by that correction's root the two are the same
update (tests/test_optimizers.py compares them with Keras' own). Keras' global-norm
clip squares, sums and scales each gradient in calls of its own; PyTorch's
`_foreach_norm` and `_foreach_mul` (what `torch.nn.utils.clip_grad_norm_` calls) take
them all at once.
"""

import math


def eager_torch():
    """Whether these kernels apply: the PyTorch backend, running eagerly. Under
    `torch.compile` (`jit_compile=True`) Keras' own step is traced whole and fused by
    the compiler; these kernels would break its graph (the step count is read as a
    number).

    Example:

    >>> import keras
    >>> eager_torch() == (keras.backend.backend() == "torch")
    True
    """
    import keras

    if keras.backend.backend() != "torch":
        return False
    import torch

    return not torch.compiler.is_compiling()


def _by_device_and_dtype(tensors):
    """The indices of `tensors` (None left out) grouped by device and dtype: a fused or
    foreach kernel takes tensors of one device and dtype."""
    groups = {}
    for i, tensor in enumerate(tensors):
        if tensor is not None:
            groups.setdefault((tensor.device, tensor.dtype), []).append(i)
    return groups.items()


def adam_update(variables, grads, momentums, velocities, maxima, *, step, learning_rate,
                beta_1, beta_2, epsilon):
    """Keras' Adam update (`keras.optimizers.Adam.update_step`) of every torch tensor in
    `variables`, in place, with PyTorch's fused kernel.

    Args:
        variables: the variables' values (torch tensors), updated in place.
        grads: their gradients, one per variable.
        momentums, velocities: the first and second moments, updated in place.
        maxima: the maxima of the second moments (`amsgrad`), or an empty list.
        step: the update's 1-based count (Keras' `iterations + 1`).
        learning_rate: the step's learning rate (a number or a scalar tensor).
        beta_1, beta_2, epsilon: Adam's, as Keras' `Adam` takes them.

    Example:

    >>> import torch
    >>> w, m, v = torch.tensor([1.0]), torch.zeros(1), torch.zeros(1)
    >>> adam_update([w], [torch.tensor([0.5])], [m], [v], [], step=1, learning_rate=0.1,
    ...             beta_1=0.9, beta_2=0.999, epsilon=1e-7)
    >>> round(w.item(), 4), round(m.item(), 4)  # the first step moves by the learning rate
    (0.9, 0.05)
    """
    import torch

    # Keras: m * lr * sqrt(c2) / c1 / (sqrt(v) + eps); the kernel:
    # m * lr / c1 / (sqrt(v) / sqrt(c2) + eps'), equal with eps' = eps / sqrt(c2).
    step = float(step)
    correction = math.sqrt(1 - beta_2**step)
    with torch.no_grad():
        for (device, dtype), indices in _by_device_and_dtype(variables):
            steps = torch.full((), step, dtype=torch.float32, device=device)
            torch._fused_adam_(
                [variables[i] for i in indices],
                [grads[i].to(dtype) for i in indices],
                [momentums[i] for i in indices],
                [velocities[i] for i in indices],
                [maxima[i] for i in indices] if maxima else [],
                [steps] * len(indices),
                amsgrad=bool(maxima), lr=float(learning_rate), beta1=beta_1, beta2=beta_2,
                weight_decay=0.0, eps=epsilon / correction, maximize=False,
                grad_scale=None, found_inf=None,
            )


def clip_by_global_norm(grads, clip_norm):
    """Keras' `clip_by_global_norm` (the clip of `global_clipnorm`) of torch tensors:
    `grads` (None where a variable has none) scaled by `clip_norm / max(norm, clip_norm)`,
    `norm` the L2 norm of all of them together; NaN if that norm is not finite.

    Example:

    >>> import torch
    >>> clipped = clip_by_global_norm([torch.tensor([3.0]), None, torch.tensor([4.0])], 1.0)
    >>> [None if g is None else round(g.item(), 4) for g in clipped]
    [0.6, None, 0.8]
    """
    import torch

    groups = _by_device_and_dtype(grads)
    with torch.no_grad():
        # Each norm accumulated in float32, a float16 gradient's too.
        norms = [torch.stack(torch._foreach_norm([grads[i] for i in indices], 2,
                                                 dtype=torch.float32))
                 for _, indices in groups]
        norm = torch.linalg.vector_norm(torch.cat([n.to(norms[0].device) for n in norms]))
        # As Keras: 1 under the bound, and NaN where the norm is not finite.
        scale = clip_norm * torch.clamp(1.0 / norm, max=1.0 / clip_norm) + (norm - norm)
        clipped = list(grads)
        for (device, dtype), indices in groups:
            scaled = torch._foreach_mul([grads[i] for i in indices], scale.to(device, dtype))
            for i, g in zip(indices, scaled):
                clipped[i] = g
    return clipped
