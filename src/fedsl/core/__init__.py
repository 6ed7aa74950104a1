"""The bottom layer: types, randomness and the thread count every other layer may use; imports nothing of fedsl."""
