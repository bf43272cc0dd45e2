"""Built-in quantizer plugins."""
