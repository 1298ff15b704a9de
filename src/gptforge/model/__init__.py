"""GPT-2 model: its shape (config.py), the network (gpt.py) and the fused loss (loss.py)."""
