"""The compact store: checkpoints as independently decodable frame blocks."""
