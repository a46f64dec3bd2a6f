"""Where checkpoints come from: local paths and Hugging Face Hub ids."""
