"""``python -m enginekit.claims [--quick] [--out FOLDER]``."""

from enginekit.claims.job import main

raise SystemExit(main())
