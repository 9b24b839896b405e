"""The rollout worker's loop, lease renewal, stop strings and verifiers, without a model."""
