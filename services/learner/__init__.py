"""The learner: GRPO loss, trajectory pulling, optimizer, checkpoints and policy publishing."""
