"""The device a framework computes on, by name (the benchmarks record it with their
figures, and the test suite's report names it), and the CPU's feature flags."""


def device_name(framework):
    """The accelerator `framework` computes on (e.g. "NVIDIA H200"), or "cpu"."""
    if framework == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        return tf.config.experimental.get_device_details(gpus[0])["device_name"] if gpus else "cpu"
    if framework == "jax":
        import jax

        device = jax.devices()[0]
        return device.device_kind if device.platform != "cpu" else "cpu"
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def cpu_flags():
    """The CPU's feature flags (`/proc/cpuinfo`'s first `flags` line), or an empty set
    where the system does not list them.

    Example:

    >>> "fpu" in cpu_flags()  # on Linux on x86-64
    True
    """
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
