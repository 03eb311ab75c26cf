"""Every reference from the README, the docs, the compose files, configs, deploy/ and scripts/ to a
page of docs/ resolves: the page exists, and a named section (`docs/deploy.md, "Worker names"` or
`docs/deploy.md "A colocated node"`) is a heading of that page or a paragraph's bold lead-in
(`**Worker names.**`); a Markdown link's file exists. A section that an edit deletes or renames
fails here, not in a reader's hands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "docker-compose.yml",
    REPO / "docker-compose.gpus.yml",
    *sorted(p for p in (REPO / "scripts").iterdir() if p.is_file()),
    *sorted((REPO / "configs").rglob("*.yaml")),
    *sorted((REPO / "deploy").rglob("*.yaml")),
    *sorted((REPO / "deploy").rglob("*.yml")),
]
# docs/X.md, "Section" | docs/X.md "Section" | docs/X.md ("Section" (quotes straight or curly)
SECTION_REF = re.compile(r"(docs/[\w.-]+\.md),?\s*\(?[\"“]([^\"”]+)[\"”]")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _words(text: str) -> str:
    """Whitespace collapsed, a comment continuation (`\\n#   `) of YAML or shell joined."""
    return " ".join(re.sub(r"\n\s*#", " ", text).split())


def labels(page: Path) -> list[str]:
    """The headings of `page` and its paragraphs' bold lead-ins, whitespace collapsed."""
    text = page.read_text(encoding="utf-8")
    headings = [re.sub(r"^#+\s*", "", line) for line in text.splitlines() if re.match(r"#{1,6} ", line)]
    bold = re.findall(r"\*\*([^*]+?)\.?\*\*", text)
    return [_words(label) for label in headings + bold]


def section_refs(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), _words(m.group(2))) for m in SECTION_REF.finditer(text)]


def unresolved(source: Path) -> list[str]:
    text = source.read_text(encoding="utf-8", errors="replace")
    where = source.relative_to(REPO)
    out = []
    for doc, section in section_refs(text):
        page = REPO / doc
        if not page.is_file():
            out.append(f'{where}: {doc} "{section}": no such page')
        elif not any(label.startswith(section) for label in labels(page)):
            out.append(f'{where}: {doc} "{section}": no such heading or bold lead-in')
    if source.suffix == ".md":
        for m in MD_LINK.finditer(text):
            target = m.group(1)
            if not re.match(r"[a-z]+:", target) and not (source.parent / target).exists():
                out.append(f"{where}: link to {target}: no such file")
    return out


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_docs_reference_resolves(source):
    assert unresolved(source) == []


def test_a_lost_section_is_caught(tmp_path):
    """The check itself: a reference to a heading a page no longer has is reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "deploy.md").write_text("# Deploying\n\n## Kubernetes\n\n**Worker names.** slots\n")
    refs = section_refs('see docs/deploy.md, "Worker names"; docs/deploy.md "The CPU profile"')
    assert refs == [("docs/deploy.md", "Worker names"), ("docs/deploy.md", "The CPU profile")]
    known = labels(tmp_path / "docs" / "deploy.md")
    assert [any(label.startswith(section) for label in known) for _, section in refs] == [True, False]


@pytest.mark.parametrize(
    "section",
    ["The images", "One GPU node: docker compose", "The CPU profile", "A colocated node", "NCCL inside compose"],
)
def test_the_compose_guide_is_in_docs_deploy(section):
    """The sections the README, the compose file's header and other pages send readers to."""
    assert any(label.startswith(section) for label in labels(REPO / "docs" / "deploy.md"))
