"""``python -m durable_turns.cli``: the console script."""

from __future__ import annotations

import sys

from ._main import main

sys.exit(main())
