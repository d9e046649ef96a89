"""The compact store's format: manifest, frame units, decoding, inspection."""
