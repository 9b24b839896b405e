"""The integrations (torch, TRL, verl) against a real server."""
