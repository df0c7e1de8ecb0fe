"""turbine_aot's version (a leaf module: bundles record it without importing the package)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
