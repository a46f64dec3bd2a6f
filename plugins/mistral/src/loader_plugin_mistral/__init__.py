"""loader plugin: Mistral model family for loader, including Mistral's native consolidated layout."""
