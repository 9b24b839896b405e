"""The priority server's settings, start checks, request validation and metrics, in-process."""
