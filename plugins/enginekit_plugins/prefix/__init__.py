"""Built-in prefix plugins."""
