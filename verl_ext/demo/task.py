"""The embedded demo task: write a record, given as a field list, as one exact JSON object.

Every prompt is a long shared header (the rules and worked examples, identical across
prompts: the shared-prefix forward's case) followed by a short per-prompt record. The
answer is fully determined by the record, so a converging policy repeats itself per
prompt (the n-gram drafter's case).

    system:    HEADER (rules + worked examples, ~250 tokens)
    user:      Record:\n- name: alice\n- age: 31\n- active: yes
    assistant: {"name": "alice", "age": 31, "active": true}

Canonical form (what the reward gives full credit for): keys in the record's order,
`json.dumps` separators (", " and ": "), integers bare, yes/no as true/false.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

DATA_SOURCE = "verl_ext/json_records"
ABILITY = "structured_output"

Value = str | int | bool

# Field name -> the values it draws from. Small pools so the tokenizer keeps values whole.
_STRING_FIELDS: dict[str, tuple[str, ...]] = {
    "name": ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "oscar"),
    "city": ("paris", "london", "tokyo", "berlin", "madrid", "rome", "oslo", "lima", "new york", "san diego"),
    "color": ("red", "green", "blue", "black", "white", "orange", "purple", "silver"),
    "country": ("france", "japan", "brazil", "canada", "kenya", "norway", "peru", "india"),
    "animal": ("cat", "dog", "horse", "owl", "fox", "wolf", "tiger", "panda"),
    "job": ("teacher", "pilot", "nurse", "chef", "lawyer", "farmer", "artist", "engineer"),
    "team": ("alpha", "bravo", "delta", "echo", "falcon", "orion"),
}
_INT_FIELDS: dict[str, tuple[int, int]] = {
    "age": (18, 90),
    "id": (1, 999),
    "score": (0, 100),
    "year": (1950, 2024),
    "rank": (1, 50),
    "level": (1, 9),
}
_BOOL_FIELDS: tuple[str, ...] = ("active", "verified", "admin", "remote")

FIELD_NAMES: tuple[str, ...] = (*_STRING_FIELDS, *_INT_FIELDS, *_BOOL_FIELDS)
MIN_FIELDS, MAX_FIELDS = 3, 6

HEADER = """You turn a record into one JSON object.

Rules:
1. Write one JSON object on one line and nothing else.
2. Keep every field of the record, in the same order, and add no other field.
3. Keys and text values are written in double quotes, exactly as given.
4. Numbers are written without quotes.
5. The words yes and no become true and false, without quotes.
6. Put a colon and a space after each key, and a comma and a space between fields.

Example 1
Record:
- name: grace
- age: 42
- remote: no
Answer:
{"name": "grace", "age": 42, "remote": false}

Example 2
Record:
- city: new york
- score: 7
- color: blue
- verified: yes
Answer:
{"city": "new york", "score": 7, "color": "blue", "verified": true}

Example 3
Record:
- id: 310
- job: pilot
- team: orion
- admin: yes
Answer:
{"id": 310, "job": "pilot", "team": "orion", "admin": true}

Now do the same for the record below. Answer with the JSON object only."""


@dataclass(frozen=True)
class Example:
    """One task instance: the record, its chat prompt and its canonical answer."""

    fields: tuple[tuple[str, Value], ...]

    @property
    def user_text(self) -> str:
        lines = [f"- {key}: {_spec_value(value)}" for key, value in self.fields]
        return "Record:\n" + "\n".join(lines)

    @property
    def messages(self) -> list[dict[str, str]]:
        return chat(HEADER, self.user_text)

    @property
    def record_only_messages(self) -> list[dict[str, str]]:
        """The prompt without the shared header: a cheap curriculum for the warm start."""
        return self.messages[1:]

    @property
    def answer(self) -> str:
        return canonical_json(dict(self.fields))


LIST_HEADER = """You turn a list of records into one JSON array of objects, one object per record, in order.

Rules:
1. Write one JSON array on one line and nothing else.
2. Write each record as one JSON object: every field of the record, in the same order, and no other field.
3. Keys and text values are written in double quotes, exactly as given.
4. Numbers are written without quotes.
5. The words yes and no become true and false, without quotes.
6. Put a colon and a space after each key, and a comma and a space between fields and between objects.

Example
Records:
Record 1:
- name: grace
- age: 42
Record 2:
- city: new york
- verified: yes
Answer:
[{"name": "grace", "age": 42}, {"city": "new york", "verified": true}]

Now do the same for the records below. Answer with the JSON array only."""
MIN_RECORDS, MAX_RECORDS = 6, 10


@dataclass(frozen=True)
class RecordList:
    """The long-answer variant (demo_cpu_long): several records, answered as one JSON array (~170-290 tokens)."""

    records: tuple[Example, ...]

    @property
    def user_text(self) -> str:
        parts = [f"Record {i}:\n" + example.user_text.removeprefix("Record:\n") for i, example in
                 enumerate(self.records, 1)]
        return "Records:\n" + "\n".join(parts)

    @property
    def messages(self) -> list[dict[str, str]]:
        return chat(LIST_HEADER, self.user_text)

    record_only_messages = Example.record_only_messages

    @property
    def answer(self) -> str:
        return json.dumps([dict(example.fields) for example in self.records], ensure_ascii=True)


def chat(header: str, user_text: str) -> list[dict[str, str]]:
    """The prompt as chat messages: the shared header as the system turn, the record(s) as the user's."""
    return [{"role": "system", "content": header}, {"role": "user", "content": user_text}]


def canonical_json(record: dict[str, Value]) -> str:
    """The only text that earns full credit."""
    return json.dumps(record, ensure_ascii=True)


def _spec_value(value: Value) -> str:
    if isinstance(value, bool):  # bool before int: bool is an int subclass
        return "yes" if value else "no"
    return str(value)


def _draw_value(rng: random.Random, key: str) -> Value:
    if key in _STRING_FIELDS:
        return rng.choice(_STRING_FIELDS[key])
    if key in _INT_FIELDS:
        return rng.randint(*_INT_FIELDS[key])
    return rng.random() < 0.5


def random_example(rng: random.Random) -> Example:
    keys = rng.sample(FIELD_NAMES, rng.randint(MIN_FIELDS, MAX_FIELDS))
    return Example(tuple((key, _draw_value(rng, key)) for key in keys))


def random_record_list(rng: random.Random) -> RecordList:
    return RecordList(tuple(random_example(rng) for _ in range(rng.randint(MIN_RECORDS, MAX_RECORDS))))


# the task's variants, by build profile: what one prompt asks for
DRAWS = {"record": random_example, "record_list": random_record_list}


def make_examples(n: int, seed: int, *, exclude: frozenset = frozenset(), kind: str = "record") -> list:
    """`n` distinct examples of `kind` (a key of DRAWS), the same for the same seed, none of them in `exclude`."""
    rng = random.Random(seed)
    seen = set(exclude)
    examples: list = []
    while len(examples) < n:
        example = DRAWS[kind](rng)
        if example not in seen:
            seen.add(example)
            examples.append(example)
    return examples


def tokenizer_corpus(examples: list[Example]) -> list[str]:
    """Texts the tokenizer is trained on: the header once, then every record and answer.

    The header is given once only: repeated per prompt, BPE would spend its merges on it.
    """
    return [HEADER] + [f"{example.user_text}\n{example.answer}" for example in examples]
