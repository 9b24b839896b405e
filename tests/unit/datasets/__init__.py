"""Dataset loaders."""
