"""Reading files: local and gs:// paths, streamed gzip and `.npy` payloads."""
