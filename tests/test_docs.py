"""The documentation: README.md and the site under docs/ (mkdocs.yml).

The site builds with `mkdocs build --strict` (a broken link, anchor, API reference or
benchmark table fails it), every ```python block of README.md and the pages runs as
written, in reading order, README.md's links lead to files and headings that exist, and
the command-line page lists every command. The shell commands are tests/test_journey.py's.
"""

import os
import re
import subprocess
import sys

import pytest
from helpers import ROOT, doc_pages

PAGES = doc_pages()
EXAMPLES = [
    (path, index, code)
    for path, text in PAGES
    for index, code in enumerate(re.findall(r"```python\n(.*?)```", text, flags=re.S))
]


def test_the_site_builds_strictly(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # The performance page's tables come from bench/results/ (docs/hooks.py).
    performance = (tmp_path / "site" / "performance" / "index.html").read_text()
    assert "bench table:" not in performance and "<td>keras-tensorflow</td>" in performance


@pytest.mark.parametrize("path, index, code", EXAMPLES, ids=[f"{p}:{i}" for p, i, _ in EXAMPLES])
def test_docs_example_runs(path, index, code):
    exec(compile(code, f"{path} example {index}", "exec"), {})


def _slug(heading):
    """A Markdown heading's anchor, as GitHub and MkDocs' toc make it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_readme_links_lead_to_files_and_headings():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", readme)
    local = [(target, anchor) for target, anchor in links if "://" not in target]
    assert local, "README.md links to no docs"
    for target, anchor in local:
        path = ROOT / target
        assert path.exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", path.read_text(), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, f"{target} has no heading #{anchor}"


def test_the_command_line_page_lists_every_command():
    from keras_vit import cli

    cli.build_parser()  # registers the commands
    page = (ROOT / "docs" / "cli.md").read_text()
    listed = re.findall(r"^\| `([a-z]+)` \|", page, flags=re.M)
    assert sorted(listed) == sorted(cli.COMMANDS)


def test_the_readme_stays_short():
    """README.md introduces; the guides hold the rest (issue 49: at most 250 lines)."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
