"""The one exception every ``check_*`` raises: a generated case broke the property."""


class PropertyViolation(AssertionError):
    """A generated case broke the property; the message says how."""
