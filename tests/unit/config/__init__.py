"""Settings across every configuration model."""
