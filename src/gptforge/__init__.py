"""gptforge: locked GPU environments for GPT pretraining, and the pretraining package that runs in them."""

__version__ = "0.1.0"
