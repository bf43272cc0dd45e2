"""Built-in queue plugins: the order in which waiting requests are tried for admission."""
