"""A multirun sweep's table and plots (``python -m enginekit.sweep <folder>``)."""
