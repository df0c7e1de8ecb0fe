"""``python -m turbine_params`` runs the CLI."""

from __future__ import annotations

import sys

from ._cli import main

sys.exit(main())
