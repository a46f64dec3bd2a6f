"""loader plugin: llama.cpp GGUF checkpoints for loader"""
