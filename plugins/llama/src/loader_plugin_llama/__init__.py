"""loader plugin: Llama 2/3/3.x model family for loader."""
