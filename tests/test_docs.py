"""The user docs (README.md, docs/**/*.md, benchmarks/RESULTS.md): every link stays inside the
repository and resolves, and the prose speaks to users in the project's own words.

A user doc describes behaviour; it does not cite the design notes the project was built from by
name (those names appear once, in docs/README.md's "Specifications" section), nor the project's
own issue tracker or its acceptance lists.
"""

import re
import tomllib
from pathlib import Path

import pytest


def repo_root() -> Path:
    """The checkout: the nearest folder above this file holding pyproject.toml."""
    for folder in Path(__file__).resolve().parents:
        if (folder / "pyproject.toml").is_file():
            return folder
    raise FileNotFoundError(f"no pyproject.toml above {__file__}")


ROOT = repo_root()
USER_DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINKED_DOCS = [*USER_DOCS, ROOT / "benchmarks" / "RESULTS.md"]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose(text: str) -> str:
    """The text without fenced code blocks, their lines kept (blank) so line numbers hold."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every inline, image and reference link outside code."""
    text = INLINE_CODE.sub("", prose(path.read_text()))
    found = []
    for pattern in (LINK, REFERENCE):
        for match in pattern.finditer(text):
            found.append((text.count("\n", 0, match.start()) + 1, match.group(1)))
    return found


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file (lower case, punctuation dropped,
    spaces as dashes, repeats numbered)."""
    anchors: set[str] = set()
    for line in prose(path.read_text()).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def link_problem(doc: Path, target: str) -> str | None:
    """Why a link from ``doc`` does not resolve inside the repository, or None when it does."""
    if SCHEME.match(target) or target.startswith("//"):
        return "leaves the repository (a URL)"
    file_part, _, anchor = target.partition("#")
    if not file_part:
        resolved = doc
    elif file_part.startswith("/"):
        return "is absolute (write it relative to the document)"
    else:
        resolved = (doc.parent / file_part).resolve()
    if not resolved.is_relative_to(ROOT):
        return f"leaves the repository ({resolved})"
    if not resolved.exists():
        return "names no file in the repository"
    if anchor and resolved.suffix == ".md" and anchor.lower() not in heading_anchors(resolved):
        return f"names no heading #{anchor} in {resolved.relative_to(ROOT)}"
    return None


def test_the_docs_are_where_this_test_looks():
    names = {str(p.relative_to(ROOT)) for p in LINKED_DOCS}
    assert {"README.md", "docs/README.md", "docs/pipeline.md", "benchmarks/RESULTS.md"} <= names


def test_every_link_resolves_inside_the_repository():
    bad = []
    for doc in LINKED_DOCS:
        for line, target in links(doc):
            problem = link_problem(doc, target)
            if problem:
                bad.append(f"{doc.relative_to(ROOT)}:{line}: ({target}) {problem}")
    assert not bad, "links that do not resolve inside the repository:\n" + "\n".join(bad)


def test_the_link_check_catches_what_it_should(tmp_path):
    """The checker itself, on links a doc in docs/ could hold."""
    doc = ROOT / "docs" / "pipeline.md"
    assert link_problem(doc, "datasets.md") is None
    assert link_problem(doc, "../benchmarks/RESULTS.md") is None
    assert link_problem(doc, "#telemetry") is None
    assert link_problem(doc, "#no-such-heading") is not None
    assert "leaves the repository" in link_problem(doc, "../../shared/seeds/splice-document-dataset.md")
    assert "leaves the repository" in link_problem(doc, "https://example.com/x.md")
    assert link_problem(doc, "no_such_file.md") == "names no file in the repository"
    sample = tmp_path / "sample.md"
    sample.write_text(
        "See [a](one.md) and ![b](two.png).\n```python\nx = d[i](y)  # [not](a-link.md)\n```\n"
        "`[code](skipped.md)` and [c](three.md#part)\n[ref]: four.md\n"
    )
    assert links(sample) == [(1, "one.md"), (1, "two.png"), (5, "three.md#part"), (6, "four.md")]


# The names of the specifications the project implements; docs/README.md lists them, once.
SPECIFICATIONS = (
    "blockwise-shuffle-plan.md",
    "data-loader-design.md",
    "preblocked-chunks.md",
    "splice-document-dataset.md",
    "token-balanced-interleave.md",
)

# Words that speak of how the project was made rather than of what it does. "seed" as a random
# seed (`offset_seed`, "an int seed", "seed 0") is a user's word and stays allowed; "the seed" as
# the name of a specification is not.
BANNED = {
    "the seed (a specification)": re.compile(r"\bthe seed\b(?!_)", re.I),
    "seed: (a specification cited)": re.compile(r"\bseed:", re.I),
    "seeds/ (the specifications' folder)": re.compile(r"\bseeds/", re.I),
    "must-show / must show": re.compile(r"\bmust[- ]shows?\b", re.I),
    "an issue number": re.compile(r"\bissues? #?\d+", re.I),
    "an issue reference (#N)": re.compile(r"(?<![\w&/])#\d+\b"),
}


def offences(text: str, label: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for name, pattern in BANNED.items():
            for match in pattern.finditer(line):
                found.append(f"{label}:{number}: {name}: {match.group(0)!r} in {line.strip()!r}")
    return found


def test_user_docs_speak_in_their_own_words():
    found = [line for doc in USER_DOCS for line in offences(doc.read_text(), str(doc.relative_to(ROOT)))]
    assert not found, "user docs citing how the project was made:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line, banned",
    [
        ("The seed's bare checkpoint JSON loads too", True),
        ("Where the seed is ambiguous", True),
        ("(seed: `preblocked-chunks.md`)", True),
        ("[spec](../../shared/seeds/splice.md)", True),
        ("Levanter's own example blocks (must-show 1, 2, 5)", True),
        ("Every kernel must show 0 recompiles", True),
        ("as issue 20 asked", True),
        ("fixed in #34", True),
        ("key=jax.random.key(0) (or an int seed)", False),
        ("`offset_seed: 11` gives the axis its own seed", False),
        ("On the paragraph corpus above (seed 0):", False),
        ("a seeded 20-200 ms delay; the run's data_seed", False),
        ("the batch's `tokens[:, 1:]`; colour #ff7f0e; &#8212;", False),
    ],
)
def test_the_word_check_tells_the_spec_word_from_a_random_seed(line, banned):
    assert bool(offences(line, "sample")) == banned


def test_specification_names_appear_once_in_the_docs_index():
    """Only docs/README.md's "Specifications" section names the specification files."""
    index = (ROOT / "docs" / "README.md").read_text()
    section = re.search(r"^## Specifications\n(.*?)(?=^## |\Z)", index, re.S | re.M)
    assert section, "docs/README.md has no '## Specifications' section"
    missing = [name for name in SPECIFICATIONS if name not in section.group(1)]
    assert not missing, f"docs/README.md's Specifications section does not name {missing}"
    outside = index[: section.start()] + index[section.end() :]
    found = []
    for doc in USER_DOCS:
        text = outside if doc == ROOT / "docs" / "README.md" else doc.read_text()
        for number, line in enumerate(text.splitlines(), start=1):
            found += [f"{doc.relative_to(ROOT)}:{number}: {name}" for name in SPECIFICATIONS if name in line]
    assert not found, "specification names outside docs/README.md's Specifications section:\n" + "\n".join(
        found
    )


def test_measurements_are_in_results_and_the_docs_link_there():
    """The README's measured ratios come from benchmarks/RESULTS.md, which it links."""
    readme = (ROOT / "README.md").read_text()
    assert "](benchmarks/RESULTS.md)" in readme


def test_the_license_is_an_spdx_string():
    """setuptools (>= 77) reads `project.license` as an SPDX expression; the table form
    (`{ text = ... }`) makes `pip install -e .` print a deprecation banner."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert isinstance(pyproject["project"]["license"], str), pyproject["project"]["license"]
    requires = pyproject["build-system"]["requires"]
    setuptools = [r for r in requires if r.replace(" ", "").startswith("setuptools")]
    assert setuptools and re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", setuptools[0].replace(" ", "")), requires
    assert int(re.search(r">=(\d+)", setuptools[0]).group(1)) >= 77, requires
