"""textattn: text classification with interchangeable attention mechanisms in JAX/Flax."""

__version__ = "0.1.0"
