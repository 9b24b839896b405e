"""Model resolution, weight I/O and the real small model."""
