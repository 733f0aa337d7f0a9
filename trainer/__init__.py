"""The resumable Llama trainer that specprobe checks: `python -m trainer.train` (trainer/train.py)."""
