"""turbine-fx test setup: make ``fx_helpers`` importable (tests run with --import-mode=importlib)."""

from __future__ import annotations

import sys
from pathlib import Path

_here = str(Path(__file__).resolve().parent)
if _here not in sys.path:
    sys.path.insert(0, _here)
