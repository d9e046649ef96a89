"""Dopamine's replay checkpoint files: find, read, check, summarise, write."""
