"""docs/cli.md is generated from the CLI's argparse parser (tools/cli_reference.py) and is current.

A new command or option in caravanserai/cli.py or cli_checkpoints.py fails this test until the page is
regenerated with ``python tools/cli_reference.py --write``.
"""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

SCRIPT = REPO / "tools" / "cli_reference.py"
PAGE = REPO / "docs" / "cli.md"


def test_cli_reference_is_current():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr + "\n(run: python tools/cli_reference.py --write)"


def test_every_command_and_option_of_the_parser_is_on_the_page():
    sys.path.insert(0, str(REPO / "tools"))
    import cli_reference

    from caravanserai.cli import build_parser

    page = PAGE.read_text(encoding="utf-8")
    for name, _, sub in cli_reference.subcommands(build_parser()):
        assert f"### `caravanserai {name}`" in page
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help", "--store"):
                    assert f"`{flag}" in page.split(f"### `caravanserai {name}`", 1)[1], (name, flag)


def test_a_changed_parser_makes_the_check_fail(tmp_path, monkeypatch):
    """The check really compares: a parser with one more option renders a different page."""
    sys.path.insert(0, str(REPO / "tools"))
    import cli_reference

    before = cli_reference.render()
    original = cli_reference.build_parser

    def with_new_option():
        parser = original()
        for name, _, sub in cli_reference.subcommands(parser):
            if name == "list":
                sub.add_argument("--since", metavar="WHEN", help="only runs updated since WHEN")
        return parser

    monkeypatch.setattr(cli_reference, "build_parser", with_new_option)
    after = cli_reference.render()
    assert after != before and "`--since WHEN` | only runs updated since WHEN" in after
    monkeypatch.setattr(cli_reference, "PAGE", tmp_path / "cli.md")
    (tmp_path / "cli.md").write_text(before)
    assert cli_reference.main(["--check"]) == 1
