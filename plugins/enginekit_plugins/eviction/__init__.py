"""Built-in eviction plugins."""
