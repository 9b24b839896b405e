"""The rollout worker: generation backends, verifiers, datasets, the lease→generate→report loop."""
