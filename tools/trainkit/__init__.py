"""Helpers of tools/train_tiny.py: the corpus and the checkpoint export."""
