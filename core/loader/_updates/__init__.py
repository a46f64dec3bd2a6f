"""Live weight updates: new tensors written into a loaded model's existing storage (``loader.update_weights``)."""
