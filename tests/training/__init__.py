"""Training: the trainer and its hooks, checkpoints and faults, stock Trainer use, several processes, preemption."""
