"""Replay datasets on disk: finding, checking, summarising and writing them."""
