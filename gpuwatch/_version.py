"""gpuwatch's version: the one place it is written (the package, the wire, the build)."""

__version__ = "0.1.0"
