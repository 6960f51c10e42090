"""The error for a model on disk that cannot serve, raised by both of its readers: `.keras`
files (`model_files`) and sharded checkpoints (`sharded_state`, which imports JAX)."""


class DamagedModel(ValueError):
    """A model file or sharded checkpoint that cannot serve: truncated or corrupt, or
    holding NaN or infinite weights (what a diverged run saves)."""
