"""The one error of preparing data: a bad option or input, named (the CLI exits 2 with its message)."""


class PrepareError(ValueError):
    """A bad option or input; the message names the option and the value."""
