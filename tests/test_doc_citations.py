"""Every citation of the specification resolves (docs/design.md §7 has the scheme).

The code cites sections (``docs/reference-formats.md §4.3``), headings by name (``docs/engine.md, "Roofline"``),
decisions (``design D2``) and invariants (``INV-13``, ``BC-10``). Each must name something that exists in
``docs/``: a cited section whose heading was renumbered or removed, a decision that is not defined, or a page that
does not exist fails here with the file and line of the citation. The same goes for the relative links between
the docs and README, anchors included.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CODE_DIRS = ("blis_sim", "pytest_blis", "tools", "benchmarks", "tests")
CODE_SUFFIXES = {".py", ".pyx", ".pxi", ".pxd"}

PAGE_RE = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.md)\b")
SECTION_RE = re.compile(r"§\s?(\d+(?:\.\d+)*)")
QUOTED_RE = re.compile(r"((?:docs/)?[\w-]+\.md)`{0,2}\)?,?\s*\(?\"([^\"]+)\"")
DECISION_RE = re.compile(r"\bD(\d{1,2})\b")
INVARIANT_RE = re.compile(r"\b((?:INV|BC)-\d+)\b")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
OUTSIDE_RE = re.compile(r"\.\./shared|\bshared/(?:reference|samples)|\breference/[\w-]+\.md")
HEADING_NUMBER_RE = re.compile(r"^(?:§\s?)?(\d+(?:\.\d+)*)\.?(?:\s|$)")


@functools.cache
def _headings(page: Path) -> tuple[str, ...]:
    out, fenced = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.append(line.lstrip("#").strip())
    return tuple(out)


def _plain(text: str) -> str:
    return text.replace("`", "").strip()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", _plain(heading).lower()).replace(" ", "-")


@functools.cache
def _anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in _headings(page):
        s = _slug(h)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return frozenset(out)


def has_section(page: Path, number: str) -> bool:
    for h in _headings(page):
        m = HEADING_NUMBER_RE.match(h)
        if m and m.group(1) == number:
            return True
    return False


def has_heading(page: Path, text: str) -> bool:
    """A heading that starts with ``text`` (after its number, if any), or a paragraph led by it in bold."""
    want = _plain(text).lower()
    if any(_plain(HEADING_NUMBER_RE.sub("", h)).lower().startswith(want) for h in _headings(page)):
        return True
    return any(line.startswith("**") and _plain(line[2:]).lower().startswith(want)
               for line in page.read_text().splitlines())


@functools.cache
def _defined(kind: str) -> frozenset[str]:
    """The decisions (``D3``) and invariants (``INV-13``) docs/design.md defines as headings."""
    pat = re.compile(r"^(D\d+)\." if kind == "decision" else r"^((?:INV|BC)-\d+)\b")
    return frozenset(m.group(1) for h in _headings(DOCS / "design.md") if (m := pat.match(h)))


def _page_path(name: str, *, in_doc: Path | None) -> Path:
    """A page named in code is relative to the repository; in a doc, to the doc (README's bare names: docs/)."""
    if in_doc is not None and not name.startswith("docs/"):
        beside = (in_doc.parent / name).resolve()
        return beside if beside.is_file() else (DOCS / name).resolve()
    return (ROOT / name).resolve()


def check_line(line: str, *, in_doc: Path | None = None, code: bool = True) -> list[str]:
    """The citations of one line that resolve nowhere, as messages. ``in_doc`` is the page the line is in (a
    section without a page then means that page); ``code`` says the line is source, where every ``D<n>`` is a
    decision and a section must name its page."""
    errors = []
    if OUTSIDE_RE.search(line):
        errors.append("refers outside the repository (a shared design folder beside the checkout)")
    pages = [(m.start(), m.group(1)) for m in PAGE_RE.finditer(line)]
    for _, name in pages:  # in a doc, a bare name may be a link's text: its target is checked below
        if name.startswith("docs/") and not _page_path(name, in_doc=in_doc).is_file():
            errors.append(f"no such page: {name}")
    for m in SECTION_RE.finditer(line):
        before = [name for pos, name in pages if pos < m.start()]
        if before:
            page = _page_path(before[-1], in_doc=in_doc)
        elif in_doc is not None:
            page = in_doc
        else:
            errors.append(f"§{m.group(1)} names no page (write docs/<page>.md §{m.group(1)})")
            continue
        if page.is_file() and not has_section(page, m.group(1)):
            errors.append(f"§{m.group(1)}: no heading numbered {m.group(1)} in {page.name}")
    for m in QUOTED_RE.finditer(line):
        page = _page_path(m.group(1), in_doc=in_doc)
        if page.is_file() and page.parent == DOCS and not has_heading(page, m.group(2)):
            errors.append(f'{m.group(1)}, "{m.group(2)}": no such heading')
    decisions = DECISION_RE.finditer(line) if code else re.finditer(r"\b(?:design|decision|per) D(\d{1,2})\b", line)
    for m in decisions:
        if f"D{m.group(1)}" not in _defined("decision"):
            errors.append(f"D{m.group(1)} is not a decision of docs/design.md")
    for m in INVARIANT_RE.finditer(line):
        if m.group(1) not in _defined("invariant"):
            errors.append(f"{m.group(1)} is not defined in docs/design.md §5")
    if in_doc is not None:
        for m in LINK_RE.finditer(line):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            path_part, _, anchor = target.partition("#")
            page = (in_doc.parent / path_part).resolve() if path_part else in_doc
            if not page.exists():
                errors.append(f"broken link: {target}")
            elif anchor and page.suffix == ".md" and anchor not in _anchors(page):
                errors.append(f"broken anchor: {target}")
    return errors


#: The one file that must name the paths it forbids.
GUARDS = {ROOT / "tests" / "test_packaging.py"}


def _sources() -> list[tuple[Path, Path | None, bool]]:
    """(file, the doc it is or None, whether it is code)."""
    out: list[tuple[Path, Path | None, bool]] = []
    for sub in CODE_DIRS:
        for path in sorted((ROOT / sub).rglob("*")):
            if path.suffix in CODE_SUFFIXES and path.is_file() and path != Path(__file__).resolve():
                out.append((path, None, True))
    out.extend((ROOT / name, None, True) for name in (".ci/run", "conftest.py", "setup.py", "pyproject.toml"))
    out.extend((p, None, True) for p in sorted((ROOT / "scenarios").rglob("*.yaml")))
    out.append((ROOT / "README.md", ROOT / "README.md", False))
    out.extend((p, p, False) for p in sorted(DOCS.glob("*.md")))
    out.extend((p, p, False) for p in sorted((ROOT / "samples").rglob("*.md")))
    return out


def test_every_citation_resolves() -> None:
    problems = []
    for path, doc, code in _sources():
        fenced = False
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if doc is not None and line.startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                continue
            for err in check_line(line, in_doc=doc, code=code):
                if path in GUARDS and err.startswith("refers outside"):
                    continue
                problems.append(f"{path.relative_to(ROOT)}:{n}: {err}")
    assert not problems, "citations that resolve nowhere:\n" + "\n".join(problems)


def test_the_resolver_fails_on_bad_citations() -> None:
    """The check above can fail: each of these resolves nowhere, and each good twin resolves."""
    bad = [
        "see docs/reference-formats.md §99.1",       # no such section
        "rules (docs/vllm-semantics.md §2–§42)",     # the second half of a range
        "as design D42 says",                        # no such decision
        "replay keeps INV-999",                      # no such invariant
        "BC-77 applies",
        "(docs/no-such-page.md)",                    # no such page
        "the reference's rule (§3.2)",               # a section that names no page
        'docs/engine.md, "No such heading"',        # a heading by name that is not there
        "from reference/blis-pipeline.md",           # outside the repository
    ]
    for text in bad:
        assert check_line(text), text
    good = [
        "see docs/reference-formats.md §4.3",
        "rules (docs/vllm-semantics.md §2–§4)",
        "as design D2 says; replay keeps INV-13; BC-10",
        'docs/design.md, "Decisions"',
    ]
    for text in good:
        assert not check_line(text), (text, check_line(text))
    doc = DOCS / "design.md"
    assert check_line("[x](no-such.md)", in_doc=doc, code=False)
    assert check_line("[x](design.md#no-such-anchor)", in_doc=doc, code=False)
    assert not check_line("[x](design.md#4-decisions) and §5", in_doc=doc, code=False)


def test_the_spec_pages_define_what_the_code_cites() -> None:
    assert {f"D{i}" for i in range(1, 12)} <= _defined("decision")
    assert {"INV-13", "BC-9", "BC-10"} <= _defined("invariant")
