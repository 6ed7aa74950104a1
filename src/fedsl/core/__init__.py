"""The bottom layer: types, randomness, the thread count and the data errors every other layer may use; old
module names kept for a release (``moved``); imports nothing of fedsl."""
