"""Errors users see. Re-exported from the world model so every layer raises the same types."""

from cost_models.errors import ConfigError, InfeasibleError


class UserInputError(ConfigError):
    """Bad input at the boundary (unknown name, malformed file)."""


__all__ = ["ConfigError", "InfeasibleError", "UserInputError"]
