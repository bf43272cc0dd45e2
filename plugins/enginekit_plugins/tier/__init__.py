"""Built-in KV tier levels: ``none``, ``host``, ``disk``, ``redis``."""
