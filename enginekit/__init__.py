"""enginekit: an LLM inference engine built around the KV cache."""
