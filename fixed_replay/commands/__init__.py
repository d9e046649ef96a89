"""One module per `fixed-replay` subcommand (absl flags + main)."""
