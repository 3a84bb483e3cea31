"""The drafter history's files in a verl checkpoint (``global_step_N/verl_ext_speculation/``).

One pickle per rollout replica (``replica_{rank}.pkl``) and ``manifest.json`` with each file's SHA-256. Files are
written to a temporary name and renamed, so a run killed while saving leaves no half-written file under the real
name; on resume a missing, truncated or altered file is refused with its path and the fix, never loaded as a
garbage history. A checkpoint without the folder (saved with speculation off) resumes with an empty history,
logged.
"""

import hashlib
import json
import logging
import os
import pickle
from typing import Any, Optional

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"


class SpeculationStateError(RuntimeError):
    pass


def replica_file(rank: int) -> str:
    return f"replica_{rank}.pkl"


def save_states(directory: str, states: list[Any]) -> None:
    """states[rank]: what replica `rank`'s server returned (picklable)."""
    os.makedirs(directory, exist_ok=True)
    digests = {}
    for rank, state in enumerate(states):
        data = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        _write_atomically(os.path.join(directory, replica_file(rank)), data)
        digests[replica_file(rank)] = hashlib.sha256(data).hexdigest()
    # last: a manifest names only files already complete
    _write_atomically(os.path.join(directory, MANIFEST), json.dumps({"sha256": digests}, indent=1).encode())


def load_states(directory: str, replicas: int) -> Optional[list[Any]]:
    """One state per replica, or None (logged) when the checkpoint holds no history."""
    if not os.path.isdir(directory):
        logger.warning("no drafter history in %s (saved with speculation off?): drafting starts from an empty "
                       "history", directory)
        return None
    digests = _read_manifest(directory)
    return [_read_state(directory, replica_file(rank), digests) for rank in range(replicas)]


def refuse(path: str, problem: str) -> SpeculationStateError:
    directory = os.path.dirname(path)
    return SpeculationStateError(
        f"{path}: {problem}. Resume from an earlier checkpoint, or delete {directory} to resume with an empty "
        "drafter history (acceptance then starts as in a first epoch)."
    )


def _read_manifest(directory: str) -> Optional[dict[str, str]]:
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None  # written before manifests existed: the pickles are still checked for truncation
    try:
        with open(path, "rb") as f:
            return dict(json.loads(f.read())["sha256"])
    except (ValueError, KeyError, TypeError) as error:
        raise refuse(path, f"unreadable manifest ({error})") from None


def _read_state(directory: str, name: str, digests: Optional[dict[str, str]]) -> Any:
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        raise refuse(path, "missing (the checkpoint holds fewer rollout replicas than this run, or was cut short)")
    with open(path, "rb") as f:
        data = f.read()
    if digests is not None and hashlib.sha256(data).hexdigest() != digests.get(name):
        raise refuse(path, f"corrupt or truncated ({len(data)} bytes do not match the SHA-256 in {MANIFEST})")
    try:
        return pickle.loads(data)
    except Exception as error:  # noqa: BLE001 -- any unpickling failure means the same thing here
        raise refuse(path, f"corrupt or truncated ({type(error).__name__}: {error})") from None


def _write_atomically(path: str, data: bytes) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
