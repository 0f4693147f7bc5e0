"""The package version, importable by every stage without the public API."""

__version__ = "0.1.0"
