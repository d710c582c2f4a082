"""The package version, in one place (the model cards name it)."""

__version__ = "0.1.0"
