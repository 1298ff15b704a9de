"""README.md stays readable: the first screen shows the commands a newcomer needs, no table cell runs long,
and sentences stay short.

``python tests/test_readme.py`` prints the measures.

Measures, on the Markdown as markdown-it parses it (CommonMark with tables):
- cell length: the characters of a table cell's source;
- sentence length: the words of each sentence of prose (paragraphs and list items; headings, tables and code
  blocks are not prose). An inline code span counts its words, a link its text's. A sentence ends at ``.``,
  ``!`` or ``?`` followed by a space, or at the end of its paragraph.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
FIRST_SCREEN = 40
MAX_CELL = 300
MAX_MEAN_SENTENCE = 22
FIRST_SCREEN_COMMANDS = ("pixi run setup", "pixi run train-gpt2", "pixi run test")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def parse(markdown: str):
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table").parse(markdown)


def table_cells(markdown: str) -> list[str]:
    tokens = parse(markdown)
    return [tokens[i + 1].content for i, t in enumerate(tokens) if t.type in ("th_open", "td_open")]


def prose(markdown: str) -> list[str]:
    """The text of each paragraph outside tables and headings (a link's text, a code span's content)."""
    paragraphs, in_paragraph = [], False
    for token in parse(markdown):
        if token.type == "paragraph_open":
            in_paragraph = True
        elif token.type == "paragraph_close":
            in_paragraph = False
        elif token.type == "inline" and in_paragraph:
            parts = []
            for child in token.children or []:
                if child.type in ("text", "code_inline"):
                    parts.append(child.content)
                elif child.type in ("softbreak", "hardbreak"):
                    parts.append(" ")
            paragraphs.append("".join(parts))
    return paragraphs


def sentence_lengths(markdown: str) -> list[int]:
    lengths = []
    for paragraph in prose(markdown):
        lengths += [len(s.split()) for s in SENTENCE_END.split(paragraph.strip()) if s.split()]
    return lengths


def measures(markdown: str) -> dict:
    cells, lengths = table_cells(markdown), sentence_lengths(markdown)
    return {"max_cell_chars": max(map(len, cells), default=0), "cells": len(cells), "sentences": len(lengths),
            "mean_sentence_words": round(sum(lengths) / len(lengths), 1), "max_sentence_words": max(lengths)}


def test_the_measures_see_cells_and_sentences():
    sample = ("Short one. Then `a code span` counts: [a link](x.md) too\n\n# A heading is not prose\n\n"
              "| a | b |\n|---|---|\n| cell | " + "x" * 7 + " |\n\n    code is not prose either. at all\n")
    assert sentence_lengths(sample) == [2, 8]
    assert sorted(map(len, table_cells(sample))) == [1, 1, 4, 7]


def test_readme_first_screen_has_the_setup_train_and_test_commands():
    first_screen = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN])
    assert [c for c in FIRST_SCREEN_COMMANDS if c not in first_screen] == []


def test_readme_cells_and_sentences_are_short():
    found = measures(README.read_text())
    assert found["max_cell_chars"] <= MAX_CELL, found
    assert found["mean_sentence_words"] <= MAX_MEAN_SENTENCE, found


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else README
    print(path.name, measures(path.read_text()))
