"""Workloads: prompt sets loaded from local files or the Hugging Face hub."""
