"""Keras' Adam update of many variables in one fused pass on PyTorch.

Keras' PyTorch Adam updates the variables with ten `torch._foreach_*` calls, five of
which allocate a result the size of the model: each a pass over memory that a step
waits on. PyTorch's fused Adam kernel (`torch.optim.Adam(fused=True)`, what HF's
`Trainer` picks by default) reads each variable, gradient and moment once. Its rule
adds epsilon to the bias-corrected root of the second moment, Keras' to the root of the
uncorrected one; with epsilon divided by that correction's root the two are the same
update (tests/test_optimizers.py compares them with Keras' own).
"""

import math


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
    groups = {}
    for i, variable in enumerate(variables):
        groups.setdefault((variable.device, variable.dtype), []).append(i)
    with torch.no_grad():
        for (device, dtype), indices in groups.items():
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
