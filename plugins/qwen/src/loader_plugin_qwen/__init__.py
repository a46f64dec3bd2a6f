"""loader plugin: Qwen2 and Qwen3 model families for loader."""
