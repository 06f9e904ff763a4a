"""qlower's version: written into artifacts, cache keys and bench records."""
__version__ = "0.1.0"
