"""The drafter history's checkpoint files: a round trip restores the drafts; a missing, truncated or altered
file is refused with its path and the fix; a checkpoint without the folder resumes with an empty history."""

import json
import logging
import pickle

import pytest

from verl_ext.speculation import DraftRequest, SpeculationConfig, Speculator, prompt_key
from verl_ext.speculation.state_files import MANIFEST, SpeculationStateError, load_states, save_states

PROMPT = [1, 2, 3]
CONFIG = SpeculationConfig(min_match=1, max_match=4, prefetch=False)


def speculator_with_history() -> Speculator:
    spec = Speculator(CONFIG)
    for response in ([1, 2, 3, 4], [1, 2, 5, 6], [7] * 50):
        spec.observe(prompt_key(PROMPT), PROMPT, response)
    return spec


def draft_after_one(spec: Speculator) -> list[int]:
    return spec.propose([DraftRequest(9, prompt_key(PROMPT), PROMPT, [1])])[0]


@pytest.fixture
def saved(tmp_path):
    """A checkpoint folder with two replicas' histories."""
    directory = tmp_path / "global_step_3" / "verl_ext_speculation"
    save_states(str(directory), [speculator_with_history().state_dict(), speculator_with_history().state_dict()])
    return directory


def test_round_trip_restores_the_drafts(saved):
    states = load_states(str(saved), replicas=2)
    restored = Speculator(CONFIG)
    restored.load_state_dict(states[0])
    assert draft_after_one(restored) == draft_after_one(speculator_with_history()) != []
    assert not list(saved.glob("*.tmp"))  # written under a temporary name, then renamed


def refusal(directory, replicas=2) -> str:
    with pytest.raises(SpeculationStateError) as error:
        load_states(str(directory), replicas)
    message = str(error.value)
    assert "\n" not in message and f"delete {directory}" in message  # the fix, in one line
    return message


def test_truncated_file_is_refused(saved):
    path = saved / "replica_1.pkl"
    path.write_bytes(path.read_bytes()[:-40])
    assert refusal(saved).startswith(f"{path}: corrupt or truncated")


def test_altered_file_is_refused(saved):
    # same length, one byte changed inside the history: unpickles fine, so only the checksum catches it
    path = saved / "replica_0.pkl"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert refusal(saved).startswith(f"{path}: corrupt or truncated")


def test_missing_replica_file_is_refused(saved):
    assert refusal(saved, replicas=3).startswith(f"{saved / 'replica_2.pkl'}: missing")  # more replicas now
    (saved / "replica_1.pkl").unlink()
    assert refusal(saved).startswith(f"{saved / 'replica_1.pkl'}: missing")


def test_unreadable_manifest_is_refused(saved):
    (saved / MANIFEST).write_text('{"sha256": ')
    assert refusal(saved).startswith(f"{saved / MANIFEST}: unreadable manifest")


def test_checkpoint_from_before_manifests_still_checked_for_truncation(saved):
    (saved / MANIFEST).unlink()
    assert len(load_states(str(saved), replicas=2)) == 2
    path = saved / "replica_0.pkl"
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    assert refusal(saved).startswith(f"{path}: corrupt or truncated (")


def test_no_folder_is_a_logged_cold_start(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="verl_ext.speculation.state_files"):
        assert load_states(str(tmp_path / "verl_ext_speculation"), replicas=1) is None
    assert "empty history" in caplog.text


def test_manifest_lists_every_file(saved):
    assert sorted(json.loads((saved / MANIFEST).read_text())["sha256"]) == ["replica_0.pkl", "replica_1.pkl"]
    assert pickle.loads((saved / "replica_0.pkl").read_bytes())["drafter"]  # still one plain pickle per replica
