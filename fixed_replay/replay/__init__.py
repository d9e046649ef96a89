"""Replay buffers that sample a fixed dataset exactly as Dopamine does."""
