"""The package version (one place; pyproject reads it)."""

__version__ = "1.0.0.dev0"
