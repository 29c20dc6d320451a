"""``python -m caravanserai``: the CLI."""

from .cli import main

raise SystemExit(main())
