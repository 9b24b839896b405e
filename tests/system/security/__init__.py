"""Authentication, TLS, secrets and message limits."""
