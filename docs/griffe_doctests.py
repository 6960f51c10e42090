"""Griffe extension for the API pages: the `>>>` examples of keras-vit's docstrings (written
for pytest's --doctest-modules, unindented under "Example:") shown as Python code blocks."""

import re

import griffe

# A doctest: `>>>` lines, their `...` continuations and the output up to a blank line.
DOCTEST = re.compile(r"(?m)^(?P<indent>[ \t]*)>>> .*(?:\n(?P=indent)(?!\s*$).*)*")


class DoctestBlocks(griffe.Extension):
    def on_instance(self, *, obj, **kwargs):
        docstring = obj.docstring
        if docstring is not None and ">>>" in docstring.value:
            docstring.value = DOCTEST.sub(
                lambda match: "\n".join([f"{match['indent']}```pycon", match.group(0),
                                         f"{match['indent']}```"]),
                docstring.value)
