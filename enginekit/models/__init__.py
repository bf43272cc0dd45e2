"""Model shapes (and, later, Llama-family forwards)."""
