"""verl's sample keys, ``{uid}_{session_id}_{index}``: the one place they are made and taken apart.

Below both of its users: the agent loop (workers/) makes them, the trainer (trainer/) reads them back.

verl's agent loop names each trajectory in the replay buffer by its prompt's uid, the rollout (session) of that
prompt and the output's index within the rollout; a uid may itself contain ``_``, so the key splits from the right.
"""

from typing import NamedTuple


class SampleKey(NamedTuple):
    uid: str
    session: int
    index: int


def format_key(uid: str, session: int, index: int) -> str:
    return f"{uid}_{session}_{index}"


def parse_key(key: str) -> SampleKey:
    uid, session, index = key.rsplit("_", 2)
    return SampleKey(uid, int(session), int(index))


def uids(keys: list[str]) -> list[str]:
    return [parse_key(key).uid for key in keys]
