"""The bottom layer: types and randomness every other layer may use; imports nothing of fedsl."""
