"""Man pages and help cannot drift from the CLI."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from sdplan.cli import COMMANDS, cli
from sdplan.errors import ExitStatus

MAN = Path(__file__).resolve().parent.parent / "man"


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
    assert re.search(rf"^\.B {name}$", commands, re.M), f"sdplan.1 COMMANDS has no entry for {name}"
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
