"""Every `megnode` command's --help names `megnode`, shows its defaults and an example;
a command-line mistake is one `megnode: ...` line and exit status 2 (issue 13)."""

from __future__ import annotations

import argparse

import pytest

from node.cli import build_parser, main
from node.cli_surface import EXIT_USAGE, subparsers_of

PASSED_THROUGH = {"megnode analyze", "megnode simulate"}  # their own parsers' help


def parsers() -> list[argparse.ArgumentParser]:
    root = build_parser()
    return [root, *subparsers_of(root)]


@pytest.mark.parametrize("parser", parsers(), ids=lambda p: p.prog)
def test_help_names_megnode_shows_defaults_and_an_example(parser: argparse.ArgumentParser
                                                          ) -> None:
    text = parser.format_help()
    assert parser.prog.startswith("megnode") and f"usage: {parser.prog}" in text
    assert "exit status:" in text
    if parser.prog not in PASSED_THROUGH:
        assert "example:\n  megnode" in text, parser.prog
    for action in parser._actions:
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            assert "default" in (parser._get_formatter()._get_help_string(action) or ""), \
                (parser.prog, action.dest)


@pytest.mark.parametrize("argv", [["publish"], ["subscribe", "t", "--kinds", "gossip"],
                                  ["topic", "join", "t", "--timeout", "-1"], ["nonsense"]])
def test_a_command_line_mistake_is_one_line(argv: list[str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("megnode: ") and "--help" in err[0]
