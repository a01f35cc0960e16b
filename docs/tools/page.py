"""Writing a generated docs page, or checking that it is current (the
shared ``main`` of the docs/tools generators)."""
import argparse
import os
from typing import Callable


def main(path: str, render: Callable[[], str], how: str) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--check", action="store_true", help=f"exit 1 if {path} differs from what {how} writes")
    a = p.parse_args()
    text = render()
    name = os.path.relpath(path, os.path.dirname(os.path.dirname(os.path.abspath(path))))
    if a.check:
        with open(path, encoding="utf-8") as fh:
            same = fh.read() == text
        print(f"{name} is current" if same else f"{name} differs: run {how}")
        raise SystemExit(0 if same else 1)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
