"""The package version (one place; read by the model files, the C code header and the package)."""
__version__ = "0.1.0"
