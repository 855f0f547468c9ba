"""``python -m gpuwatch``: the same as the ``gpuwatch`` command."""

from .cli import main

raise SystemExit(main())
