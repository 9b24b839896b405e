"""The rollout worker against a real server, its backends and device claims."""
