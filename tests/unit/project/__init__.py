"""The project's layout: folders, layers, imports, the base install."""
