"""The published claims enginekit checks itself against (``python -m enginekit.claims``)."""
