"""Writes docs/cli.md from commprof's argparse parsers (the reference
cannot drift from the code: tests/e2e/test_docs.py compares them).

    python docs/tools/gen_cli.py            # rewrite docs/cli.md
    python docs/tools/gen_cli.py --check    # exit 1 if docs/cli.md differs
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.dirname(HERE)
sys.path.insert(0, os.path.dirname(DOCS))


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, sub, helps.get(name)


def _walk(parser, path):
    for name, sub, help_ in _subparsers(parser):
        yield (*path, name), sub, help_
        yield from _walk(sub, (*path, name))


def _options(sub):
    rows = []
    for a in sub._actions:
        if a.help == argparse.SUPPRESS or isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        flags = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.metavar or a.dest}`"
        if a.option_strings and a.nargs != 0:
            flags += f" {a.metavar or a.dest.upper()}"
        help_ = (a.help or "").replace("|", "\\|").replace("\n", " ")
        if "%(default)" in help_:
            help_ = help_.replace("%(default)s", str(a.default))
        if a.choices and not isinstance(a.choices, dict):
            help_ += f" (one of: {', '.join(str(c) for c in a.choices)})"
        rows.append(f"| {flags} | {help_} |")
    return rows


def render() -> str:
    os.environ["COLUMNS"] = "100"   # argparse wraps usage lines to the terminal's width
    from commprof.cli import build_parser

    parser = build_parser()
    out = ["# Command line", "",
           "Generated from commprof's argument parsers (`python docs/tools/gen_cli.py`); "
           "`commprof COMMAND --help` prints the same.", ""]
    for path, sub, help_ in _walk(parser, ()):
        out += [f"## commprof {' '.join(path)}", ""]
        text = sub.description or help_ or ""
        if text:
            out += [text, ""]
        out += ["```", sub.format_usage().replace("usage: ", "").strip(), "```", ""]
        rows = _options(sub)
        if rows:
            out += ["| option | meaning |", "|---|---|", *rows, ""]
    return "\n".join(out).rstrip() + "\n"


def main():
    from page import main as write_page

    write_page(os.path.join(DOCS, "cli.md"), render, "python docs/tools/gen_cli.py")


if __name__ == "__main__":
    main()
