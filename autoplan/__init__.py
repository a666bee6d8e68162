"""autoplan: automatic parallelism planning for large-model training."""

__version__ = "0.1.0"
