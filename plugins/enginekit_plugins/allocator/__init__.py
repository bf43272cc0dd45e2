"""Built-in allocator plugins."""
