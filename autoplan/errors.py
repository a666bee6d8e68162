"""The errors autoplan reports, one hierarchy (exported from ``autoplan``)::

    AutoplanError              every error meant for the user (CLI: one line on stderr)
    ├── InputError             bad input: a value breaks a constraint (CLI exit 2); alias ``ConfigError``
    │   └── UserInputError     malformed at the boundary: unknown name, unreadable file, wrong type
    └── InfeasibleError        the input is valid but no plan fits (CLI exit 3); ``hint`` says what would

The classes live in :mod:`cost_models.errors` (the world model raises them too) and are re-exported here.
"""

from cost_models.errors import AutoplanError, ConfigError, InfeasibleError

InputError = ConfigError


class UserInputError(ConfigError):
    """Bad input at the boundary (unknown name, malformed file, wrong type)."""


__all__ = ["AutoplanError", "ConfigError", "InfeasibleError", "InputError", "UserInputError"]
