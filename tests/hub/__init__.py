"""Uploading to the Hugging Face Hub (offline, against a fake Hub API)."""
