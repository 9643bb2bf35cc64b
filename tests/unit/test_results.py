"""Result templates (proxy/engine/results.py): records zipped over tensors, and records
grouped under the records they belong to (OCR's words under their lines)."""

from __future__ import annotations

import numpy as np
import orjson

from proxy.engine.results import render

LINES = {
    "d.text": np.array([b"ab cd", b"e"], dtype=object),
    "d.words": np.array([b"ab", b"cd", b"e"], dtype=object),
    "d.word_boxes": np.arange(3 * 2, dtype=np.float32).reshape(3, 2),
    "d.word_lines": np.array([0, 0, 1], np.int32),
}
GROUPED = {
    "lines": {
        "zip": {
            "text": "d.text",
            "words": {"group": {"w": "d.words", "box": "d.word_boxes"}, "by": "d.word_lines"},
        }
    }
}


def test_a_group_deals_its_records_out_to_the_records_they_name() -> None:
    assert render(GROUPED, LINES, {}) == {
        "lines": [
            {"text": "ab cd", "words": [{"w": "ab", "box": [0, 1]}, {"w": "cd", "box": [2, 3]}]},
            {"text": "e", "words": [{"w": "e", "box": [4, 5]}]},
        ]
    }


def test_a_group_without_members_or_its_index_leaves_every_record_an_empty_list() -> None:
    no_words = {**LINES, "d.words": np.zeros(0, object), "d.word_boxes": np.zeros((0, 2))}
    no_words["d.word_lines"] = np.zeros(0, np.int32)
    no_index = {k: v for k, v in LINES.items() if k != "d.word_lines"}
    for tensors in (no_words, no_index):
        assert [line["words"] for line in render(GROUPED, tensors, {})["lines"]] == [[], []]


def test_a_row_index_outside_the_records_belongs_to_none() -> None:
    stray = {**LINES, "d.word_lines": np.array([0, 5, -1], np.int32)}
    lines = render(GROUPED, stray, {})["lines"]
    assert [[w["w"] for w in line["words"]] for line in lines] == [["ab"], []]


def test_a_record_per_branch_and_rows_by_index() -> None:
    template = {
        "label": "e.label[0]",
        "last": "e.label[-1]",
        "beyond": "e.label[3]",
        "members": {"per_branch": "e", "fields": {"label": "label[0]", "p": "p[0]"}},
    }
    tensors = {"e.label": np.array([7, 8], np.int64)}
    branches = {"e": {"a": {"label": np.array([7]), "p": np.array([[0.5, 0.25]])}, "b": {}}}
    assert render(template, tensors, branches) == {
        "label": 7,
        "last": 8,
        "beyond": None,  # a row that is not there: null, never an error
        "members": {"a": {"label": 7, "p": [0.5, 0.25]}, "b": {"label": None, "p": None}},
    }


def test_a_row_of_text_renders_as_text() -> None:
    """A row of a BYTES tensor is a numpy bytes scalar, not an object: it rendered as raw
    bytes, which JSON cannot carry (a branch answering its label as text made every
    request a 500)."""
    labels = np.array([b"seven", "\u00e9t\u00e9".encode()], dtype=object)
    template = {
        "first": "e.label[0]",
        "all": "e.label",
        "members": {"per_branch": "e", "fields": {"label": "label[1]"}},
    }
    out = render(template, {"e.label": labels}, {"e": {"a": {"label": labels}}})
    assert out == {
        "first": "seven",
        "all": ["seven", "\u00e9t\u00e9"],
        "members": {"a": {"label": "\u00e9t\u00e9"}},
    }
    assert isinstance(orjson.dumps(out), bytes)
