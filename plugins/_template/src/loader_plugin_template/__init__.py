"""loader-plugin-template: NumPy ``.npz`` weight archives for loader, and the template for new plugins."""

__all__: list[str] = []
