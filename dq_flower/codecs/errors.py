"""The error every decoder raises for a malformed payload or record."""

__all__ = ["PayloadError"]


class PayloadError(ValueError):
    """A payload or record is malformed: inconsistent sizes, dtypes, widths or versions."""
