"""Built-in preemption plugins."""
