"""The documents stay small and every citation in them, or in the code, leads somewhere
(issue 23, Documents): the README fits in 8 KB, each `§section` or `P<n>` pitfall the code
cites is an anchor of docs/upstream-notes.md, and each relative link of the README and docs/
names a file of the repository."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTES = ROOT / "docs" / "upstream-notes.md"
CITING = ("moss_tts", "converters", "fixtures", "bench", "tests")

SECTION = r"\d+(?:\.\d+)?"
# `§nano-2.2`, `§family-2.4-2.8` (a range: both ends must exist), and the old form `nano.md §2`
NOTE_CITE = re.compile(rf"§(nano|family|codecs)-({SECTION})(?:-({SECTION}))?")
OLD_CITE = re.compile(rf"\b(?!design\.md)[\w/]+\.md §{SECTION}")
# a `§` that is not a note citation: the project's design document (docs/design.md, whose
# numbered sections `design_sections` checks) and RFCs; anything else is an unresolved citation
OTHER_SECTION = re.compile(r"((?i:design)(?:\.md)?\s+|RFC \d+ )§\d")
DESIGN_CITE = re.compile(r"(?i:design)(?:\.md)?\s+§(\d+)(?:-(\d+))?")
PITFALL = re.compile(r"\bP(\d{1,2})\b")


def anchors() -> set[str]:
    return set(re.findall(r'<a id="([^"]+)"></a>', NOTES.read_text(encoding="utf-8")))


def cited_files():
    """The code that may cite notes; this file is left out, as it spells bad citations on purpose."""
    for top in CITING:
        yield from sorted(p for p in (ROOT / top).rglob("*.py") if p != Path(__file__).resolve())


def unresolved_citations(text: str, known: set[str]) -> list[str]:
    """The note citations of `text` that name no anchor, the old `x.md §n` form and any stray
    `§` included."""
    bad = [m.group(0) for m in OLD_CITE.finditer(text)]
    for m in NOTE_CITE.finditer(text):
        ends = [m.group(2)] + ([m.group(3)] if m.group(3) else [])
        bad += [m.group(0) for end in ends if f"{m.group(1)}-{end}" not in known]
    stray = NOTE_CITE.sub("", OTHER_SECTION.sub("", OLD_CITE.sub("", text)))
    bad += [stray[i:i + 20] for i in [m.start() for m in re.finditer("§", stray)]]
    bad += [m.group(0) for m in PITFALL.finditer(text) if m.group(0) not in known]
    return bad


def test_every_design_citation_names_a_section_of_docs_design():
    sections = set(re.findall(r"^## (\d+)\. ", (ROOT / "docs" / "design.md").read_text(
        encoding="utf-8"), flags=re.M))
    bad = {str(path.relative_to(ROOT)): m.group(0) for path in cited_files()
           for m in DESIGN_CITE.finditer(path.read_text(encoding="utf-8"))
           if not {m.group(1), m.group(2) or m.group(1)} <= sections}
    assert sections and not bad, bad


def test_readme_fits_in_8_kb():
    assert len((ROOT / "README.md").read_bytes()) <= 8192


def test_every_citation_in_the_code_names_an_anchor_of_upstream_notes():
    known = anchors() if NOTES.exists() else set()
    bad = {}
    for path in cited_files():
        found = unresolved_citations(path.read_text(encoding="utf-8"), known)
        if found:
            bad[str(path.relative_to(ROOT))] = sorted(set(found))
    assert not bad, bad


def test_the_citation_check_catches_what_it_should():
    known = {"nano-2", "nano-2.2", "P5"}
    assert unresolved_citations("x (§nano-2.2, P5; design §3; RFC 9113 §3.4)", known) == []
    assert unresolved_citations("nano.md §2", known) == ["nano.md §2"]
    assert unresolved_citations("§nano-2-4.1", known) == ["§nano-2-4.1"]
    assert unresolved_citations("(P6)", known) == ["P6"]
    assert unresolved_citations("(§4.7)", known) == ["§4.7)"]
    assert unresolved_citations("Design §3, design.md §1", known) == []


def links(markdown: str) -> list[str]:
    """Relative link targets of a markdown text, without their #fragment."""
    targets = re.findall(r"\]\(([^)\s]+)\)", markdown)
    return [t.split("#")[0] for t in targets
            if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_every_link_in_the_readme_and_docs_names_a_file_of_the_repository():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = [(str(page.relative_to(ROOT)), target) for page in pages
               for target in links(page.read_text(encoding="utf-8"))
               if not (page.parent / target).exists()]
    assert len(pages) > 1 and not missing, missing


def test_every_anchor_a_document_links_to_exists():
    known = anchors()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(upstream-notes\.md#([^)]+)\)",
                                 page.read_text(encoding="utf-8")):
            assert target in known, (page.name, target)


def test_every_docs_page_the_code_names_exists():
    named = {(str(path.relative_to(ROOT)), page) for path in cited_files()
             for page in re.findall(r"\bdocs/[\w-]+\.md\b", path.read_text(encoding="utf-8"))}
    missing = sorted((where, page) for where, page in named if not (ROOT / page).exists())
    assert named and not missing, missing
