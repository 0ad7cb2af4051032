"""The one exception type the command line turns into a one-line message instead of a traceback."""


class UserError(Exception):
    """A problem with what the user gave us (a file, a column, a row, a flag).

    The message must name the file, column or row at fault; the CLI prints it on one line and exits 2.
    """
