"""GRPO with TRL on small addition problems.

``trl_grpo.py`` samples problems as TRL does; ``trl_grpo_prioritized.py`` is the same script with
problems from a prioreplay server (``PRIOREPLAY_SERVER``, default 127.0.0.1:50051): three lines
differ (docs/INTEGRATIONS.md). Usage:

    python examples/trl_grpo.py [MODEL] [OUTPUT_DIR] [MAX_STEPS] [SEED]
"""

import re
import sys

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

model = sys.argv[1] if len(sys.argv) > 1 else "HuggingFaceTB/SmolLM2-135M-Instruct"
output_dir = sys.argv[2] if len(sys.argv) > 2 else "runs/trl-grpo"
max_steps = int(sys.argv[3]) if len(sys.argv) > 3 else 200
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0

pairs = [(a, b) for a in range(20) for b in range(20)]
dataset = Dataset.from_dict(
    {"prompt": [f"What is {a} + {b}? Reply with the number only." for a, b in pairs], "answer": [str(a + b) for a, b in pairs]}
)


def correct(completions, answer, **kwargs):
    """1.0 when the completion's first number is the answer, else 0.0."""
    found = [re.search(r"-?\d+", c) for c in completions]
    return [float(m is not None and m.group() == a) for m, a in zip(found, answer, strict=True)]


config = GRPOConfig(
    output_dir=output_dir,
    max_steps=max_steps,
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=16,
    learning_rate=1e-5,
    logging_steps=10,
    save_strategy="no",  # no checkpoints: each holds the whole model and optimizer state
    report_to="none",
    seed=seed,
    use_cpu=not torch.cuda.is_available(),
)
trainer = GRPOTrainer(model=model, reward_funcs=correct, args=config, train_dataset=dataset)
trainer.train()
trainer.save_state()  # trainer_state.json: the logged metrics, for examples/compare_trl_runs.py
