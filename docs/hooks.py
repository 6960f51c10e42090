"""MkDocs hook: the benchmark tables of the docs come from the result files.

A line `<!-- bench table: NAME.json -->` (indented or not) in a page is replaced by the `table` that
`bench/NAME`'s script stored in `bench/results/NAME.json` (what it printed), so a page
shows what the file says. A missing file or table stops the build, naming it.
"""

import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
MARKER = re.compile(r"^( *)<!-- bench table: (\S+\.json) -->$", re.M)


def bench_table(name):
    """The stored table of `bench/results/NAME`."""
    path = RESULTS / name
    if not path.is_file():
        raise ValueError(f"docs: no benchmark result {path}")
    table = json.loads(path.read_text()).get("table")
    if not table:
        raise ValueError(f"docs: {path} holds no table")
    return table


def on_page_markdown(markdown, page, config, files):
    def table(match):  # indented as the marker (a table inside a list item)
        indent = match.group(1)
        return "\n".join(indent + line if line else line for line in bench_table(match.group(2)).splitlines())

    return MARKER.sub(table, markdown)
