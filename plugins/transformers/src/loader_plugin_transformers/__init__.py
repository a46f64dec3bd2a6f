"""loader plugin: the transformers fallback for architectures no other plugin registers."""
