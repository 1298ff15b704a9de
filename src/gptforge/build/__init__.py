"""Native builds: apex, DeepSpeed ops (and the dataset helpers), checked, cached and verified."""
