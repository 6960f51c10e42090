"""Writing CSV that spreadsheets open as data: no cell of text is run as a formula.

A cell that starts with `=`, `+`, `-` or `@` (or a tab or carriage return) is a formula
to Excel, LibreOffice and Google Sheets; one taken from a file name or a labels file
could run anything a formula can (OWASP, "CSV Injection"). Such text cells get OWASP's
leading single quote; numbers are written as they are.
"""

import csv

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def text_cell(value):
    """`value`, with a leading `'` if it is text that a spreadsheet would read as a formula.

    Example:

    >>> text_cell("=HYPERLINK(\\"http://x\\")"), text_cell("cat.jpg"), text_cell(-0.5)
    ('\\'=HYPERLINK("http://x")', 'cat.jpg', -0.5)
    """
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def write_rows(stream, rows):
    """Writes `rows` (lists of cells) as CSV lines to the text `stream`, text cells
    through `text_cell`.

    Example:

    >>> import sys
    >>> write_rows(sys.stdout, [["image", "probability"], ["-rf.png", 0.25]])
    image,probability
    '-rf.png,0.25
    """
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerows([text_cell(cell) for cell in row] for row in rows)
