"""The torch executor: real tensors, the Llama-family forward over paged KV."""
