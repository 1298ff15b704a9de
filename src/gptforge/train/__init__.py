"""Training: configuration, precision, optimizer, checkpoints, metrics, distributed engines, the loop."""
