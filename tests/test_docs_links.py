"""Every relative link in the project's documents leads to a file in the repository, and to a heading there."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = sorted([*ROOT.glob("*.md"), *ROOT.glob("docs/*.md"), *ROOT.glob("bench/*.md"), *ROOT.glob("bench/results/*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(path: Path) -> str:
    return re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # links in code blocks are examples


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of PATH: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+\s+(.*)$", prose(path), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path)) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_documents_are_found():
    assert {"README.md", "BENCHMARKS.md"} <= {p.name for p in DOCUMENTS} and any(p.parent.name == "docs" for p in DOCUMENTS)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_a_file_and_heading(document):
    broken = []
    for target in relative_links(document):
        name, _, anchor = target.partition("#")
        dest = (document.parent / name).resolve() if name else document
        if not dest.exists() or (ROOT not in dest.parents and dest != ROOT):
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{document.relative_to(ROOT)}: {broken}"
