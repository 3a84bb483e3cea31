"""Reward for the JSON-record demo task, in the form verl's reward managers call.

verl 0.9.1 loads this file by path (`reward.custom_reward_function.path`, `.name=compute_score`)
and its naive reward manager calls
`compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`, where
`solution_str` is the response decoded with special tokens skipped. The file imports only
the standard library, so it loads the same way in any process.

Scores, in [0, 1]:
    1.0               the canonical JSON text exactly (surrounding whitespace ignored)
    0.8 * fields      valid JSON object, not canonical: fraction of fields right
    0.4 * fields      not valid JSON: fraction of `"key": value` fragments found verbatim
    0.0               none of the above (garbage, empty)
where `fields` = matched fields / max(expected fields, fields written), so extra fields cost.
For the long-answer variant (ground truth a JSON array of records) `fields` is the mean over record positions
of each record's fraction, over max(expected records, records written): records are matched by position, so
a missing or extra record costs one record's share.
"""

from __future__ import annotations

import json
import re
from typing import Any

FULL, JSON_WEIGHT, FRAGMENT_WEIGHT = 1.0, 0.8, 0.4

# Text that may follow the answer when a caller decodes without skipping special tokens.
STOP_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|im_start|>")

# `"key": value` with a JSON scalar value (string without escapes, integer, true/false/null).
_FRAGMENT = re.compile(r'"([^"\\]+)": ("[^"\\]*"|-?\d+|true|false|null)')
# one object's text inside a broken array: braces with no braces inside
_OBJECT = re.compile(r"\{[^{}]*\}?")


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> float:
    """Score one response against the canonical answer `ground_truth` (a JSON object text)."""
    del data_source, extra_info, kwargs  # one task; nothing else changes the score
    answer = strip_stop_text(solution_str)
    if answer == ground_truth:
        return FULL
    expected = json.loads(ground_truth)
    if isinstance(expected, list):
        return _list_score(expected, answer)
    written = _parse_object(answer)
    if written is not None:
        return JSON_WEIGHT * _field_fraction(expected, written)
    return FRAGMENT_WEIGHT * _field_fraction(expected, _fragments(answer))


def _list_score(expected: list[dict[str, Any]], answer: str) -> float:
    written = _parse(answer)
    if isinstance(written, list) and all(isinstance(record, dict) for record in written):
        return JSON_WEIGHT * _records_fraction(expected, written)
    return FRAGMENT_WEIGHT * _records_fraction(expected, [_fragments(text) for text in _OBJECT.findall(answer)])


def _records_fraction(expected: list[dict[str, Any]], written: list[dict[str, Any]]) -> float:
    denominator = max(len(expected), len(written))
    matched = sum(_field_fraction(e, w) for e, w in zip(expected, written))
    return matched / denominator if denominator else 0.0


def strip_stop_text(solution_str: str) -> str:
    """The response up to the first stop marker, without surrounding whitespace."""
    for marker in STOP_MARKERS:
        solution_str = solution_str.split(marker, 1)[0]
    return solution_str.strip()


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _parse_object(text: str) -> dict[str, Any] | None:
    value = _parse(text)
    return value if isinstance(value, dict) else None


def _fragments(text: str) -> dict[str, Any]:
    """Fields readable verbatim from broken JSON; the first occurrence of a key wins."""
    found: dict[str, Any] = {}
    for key, raw in _FRAGMENT.findall(text):
        try:
            found.setdefault(key, json.loads(raw))
        except ValueError:  # e.g. a leading zero or a control character in the string
            continue
    return found


def _field_fraction(expected: dict[str, Any], written: dict[str, Any]) -> float:
    denominator = max(len(expected), len(written))
    matched = sum(1 for key, value in written.items() if key in expected and _same(expected[key], value))
    return matched / denominator if denominator else 0.0


def _same(expected: Any, written: Any) -> bool:
    # Types must match too: 31 is not "31", and true is not 1.
    return type(expected) is type(written) and expected == written
