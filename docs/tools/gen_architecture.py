"""Writes docs/architecture.md from ARCHITECTURE.md (the map has one home,
the repository's root; the docs site shows the same text, and
tests/e2e/test_docs.py checks that it does).

    python docs/tools/gen_architecture.py            # rewrite docs/architecture.md
    python docs/tools/gen_architecture.py --check    # exit 1 if it differs
"""
import os

from page import main

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.dirname(HERE)
SOURCE = os.path.join(os.path.dirname(DOCS), "ARCHITECTURE.md")


def render() -> str:
    with open(SOURCE, encoding="utf-8") as fh:
        return fh.read()


if __name__ == "__main__":
    main(os.path.join(DOCS, "architecture.md"), render, "python docs/tools/gen_architecture.py")
