"""The version of sohsm (its own module, so that any module can read it without importing the package)."""
__version__ = "0.8.0"
