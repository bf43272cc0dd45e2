"""``python -m enginekit.sweep <folder>``: rebuilds a sweep's table and plots."""

import sys

from enginekit.sweep.summary import main

sys.exit(main())
