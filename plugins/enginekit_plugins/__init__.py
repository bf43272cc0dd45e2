"""The built-in enginekit plugins."""
