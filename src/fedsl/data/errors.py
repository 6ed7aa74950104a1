"""Errors about data: one line naming the file or setting and the fix (the CLI prints it)."""


class DataError(ValueError):
    """Missing/corrupt files, bad checksums, unsatisfiable partitions, unknown class names."""
