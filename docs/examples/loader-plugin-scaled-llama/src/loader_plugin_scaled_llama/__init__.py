"""loader-plugin-scaled-llama: an example out-of-tree model plugin that subclasses another plugin's model."""

__all__: list[str] = []
