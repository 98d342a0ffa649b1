"""The package version: one place, read by the package, the CLI's --version and pyproject."""

__version__ = "0.2.0"
