"""Man pages, help and docs/ cannot drift from the CLI, and every reference resolves inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from sdplan.cli import COMMANDS, cli
from sdplan.errors import ExitStatus

ROOT = Path(__file__).resolve().parent.parent
MAN = ROOT / "man"
DOCS = ROOT / "docs"


def page_text(path: Path) -> str:
    return path.read_text().replace("\\-", "-").replace("\\e", "\\")


def command(name: str) -> click.Command:
    ctx = click.Context(cli)
    found = cli.get_command(ctx, name)
    assert found is not None
    return found


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help_and_a_man_page(name: str) -> None:
    assert command(name).help, f"sdplan {name} has no help"
    assert (MAN / "man1" / f"sdplan-{name}.1").exists()
    text = page_text(MAN / "man1" / "sdplan.1")
    commands = text.split(".SH COMMANDS", 1)[1].split(".SH ", 1)[0]
    see_also = text.split(".SH SEE ALSO", 1)[1].split(".SH ", 1)[0]
    assert re.search(rf"^\.B {name}$", commands, re.MULTILINE), f"sdplan.1 COMMANDS has no entry for {name}"
    assert f"sdplan-{name} (1)" in commands, f"the {name} entry in sdplan.1 COMMANDS does not cite sdplan-{name}(1)"
    assert f"sdplan-{name} (1)" in see_also, f"sdplan.1 SEE ALSO lacks sdplan-{name}(1)"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_is_documented_in_its_page(name: str) -> None:
    text = page_text(MAN / "man1" / f"sdplan-{name}.1")
    for param in command(name).params:
        if isinstance(param, click.Argument):  # arguments are in SYNOPSIS under their metavar
            continue
        for option in param.opts:
            assert option in text, f"{option} of sdplan {name} is missing from sdplan-{name}.1"


@pytest.mark.parametrize("page", sorted((MAN / "man1").glob("*.1")) + sorted((MAN / "man5").glob("*.5")),
                         ids=lambda p: p.name)
def test_pages_have_required_sections(page: Path) -> None:
    text = page.read_text()
    for section in ("NAME", "SYNOPSIS" if page.suffix == ".1" else "DESCRIPTION", "EXIT STATUS", "EXAMPLES"):
        assert f".SH {section}" in text, f"{page.name} lacks {section}"
    assert text.startswith(".TH ")


def test_main_page_lists_every_exit_status() -> None:
    text = page_text(MAN / "man1" / "sdplan.1")
    section = text.split(".SH EXIT STATUS", 1)[1].split(".SH ", 1)[0]
    for status in ExitStatus:
        assert re.search(rf"^\.B {status.value}$", section, re.M), f"exit status {status.value} undocumented"


def test_root_help_lists_every_exit_status() -> None:
    sentence = (cli.help or "").split("Exit status:", 1)[1].split("See ", 1)[0]
    listed = {int(number) for number in re.findall(r"\b(\d+) [A-Za-z]", sentence)}
    assert listed == {int(status) for status in ExitStatus}


# ----------------------------------------------------------------------------- docs/ and references

#: Citations of documents or trackers that are not in the repository: the old notes' section numbers
#: (``model.md §1.2``, ``anchors-2026-11 §1.5``), notes that never shipped (``anchors.md``, ``vllm.md``),
#: review items (``review B10``, ``(B12)``) and issue numbers. Link into ``docs/`` instead.
OUTSIDE_PATTERNS = (
    r"\b(?:model|vllm|anchors(?:-\d{4}-\d{2})?)(?:\.md)?`{0,2}\s*\u00a7",
    r"\banchors(?:-\d{4}-\d{2})?\.md\b",
    r"\bvllm\.md\b",
    r"shared/reference",
    r"\b[Rr]eview [A-Z]\d+",
    r"\([BDT]\d{1,2}\)",
    r"\b[Ii]ssue \d+",
)
OUTSIDE_REFERENCE = re.compile("|".join(OUTSIDE_PATTERNS))
#: ``docs/PAGE.md#anchor`` as docstrings and comments write it.
DOCS_LINK = re.compile(r"\bdocs/([\w-]+\.md)(?:#([\w-]+))?")
#: A relative Markdown link ``[text](target)``.
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")

def slug(title: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6} (.+)", line)):
            found.add(slug(heading.group(1)))
    return found


def source_files() -> list[Path]:
    """Every file whose text may cite a document: code, tests, benchmarks, scripts, man pages, docs.

    This file is left out: its patterns and their examples would match themselves.
    """
    files = [*ROOT.glob("sdplan/**/*.py"), *ROOT.glob("tests/*.py"), *ROOT.glob("benchmarks/*.py"),
             *ROOT.glob("benchmarks/*.md"), *ROOT.glob("scripts/*.py"), *MAN.glob("man*/*"), *DOCS.glob("*.md"),
             ROOT / "README.md"]
    return sorted(path for path in files if path.is_file() and path != Path(__file__).resolve())


def test_slug_follows_github() -> None:
    assert slug("TTFT and TPOT") == "ttft-and-tpot"
    assert slug("Speedup and break-even") == "speedup-and-break-even"
    assert slug("What sdplan relies on in vLLM (0.33)") == "what-sdplan-relies-on-in-vllm-033"


def test_the_readme_shows_how_to_install_and_test_on_its_first_screen() -> None:
    """A user who opens the README sees, before scrolling, how to install sdplan and run its tests."""
    first_screen = (ROOT / "README.md").read_text().splitlines()[:40]
    fences = [number for number, line in enumerate(first_screen) if line.startswith("```")]
    commands = [line.split("#")[0].strip() for start, end in zip(fences[::2], fences[1::2])
                for line in first_screen[start + 1:end]]
    assert "pip install -e '.[test]'" in commands and "pytest" in commands
    assert not any("<" in command for command in commands), "a placeholder where a command should be"


def test_docs_index_lists_every_page() -> None:
    index = (DOCS / "README.md").read_text()
    pages = sorted(path.name for path in DOCS.glob("*.md") if path.name != "README.md")
    assert pages, "docs/ holds no pages"
    for name in pages:
        assert f"]({name})" in index, f"docs/README.md does not link {name}"


@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_references_resolve(path: Path) -> None:
    """Every ``docs/PAGE.md#anchor`` names a page of docs/ and a heading on it."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for match in DOCS_LINK.finditer(line):
            page, anchor = DOCS / match.group(1), match.group(2)
            assert page.is_file(), f"{path.relative_to(ROOT)}:{number}: no page {page.relative_to(ROOT)}"
            assert anchor is None or anchor in anchors(page), \
                f"{path.relative_to(ROOT)}:{number}: no heading #{anchor} in {page.relative_to(ROOT)}"


@pytest.mark.parametrize("path", [ROOT / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_markdown_links_resolve(path: Path) -> None:
    """Relative links in the README and docs/ point at files that exist, and at headings that exist."""
    for target in MARKDOWN_LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: outside the repository by design
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        assert linked.exists(), f"{path.relative_to(ROOT)} links {target}: no such file"
        if anchor:
            assert anchor in anchors(linked), f"{path.relative_to(ROOT)} links {target}: no such heading"


@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_reference_points_outside_the_repository(path: Path) -> None:
    hits = [f"{number}: {match.group(0)}" for number, line in enumerate(path.read_text().splitlines(), 1)
            for match in OUTSIDE_REFERENCE.finditer(line)]
    assert not hits, f"{path.relative_to(ROOT)} cites documents outside the repository: {hits}"
