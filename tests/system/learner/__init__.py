"""The learner against a real server: training, checkpoints, distributed, reporting."""
