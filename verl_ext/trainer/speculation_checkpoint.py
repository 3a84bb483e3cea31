"""The drafter history in verl's checkpoints: each rollout replica's speculation state, saved with a step's
checkpoint (``global_step_N/verl_ext_speculation/``, files by ``verl_ext.speculation.state_files``) and given back
to the replicas on resume."""

import os

import ray

from verl_ext.speculation import state_files

SPECULATION_STATE_DIR = "verl_ext_speculation"


def saved_directory(trainer, global_steps: int) -> str:
    """Where the checkpoint of step ``global_steps`` keeps the history; ``trainer``: verl's ``trainer`` config."""
    return os.path.join(trainer.default_local_dir, f"global_step_{global_steps}", SPECULATION_STATE_DIR)


def resumed_directory(trainer, global_steps: int) -> str | None:
    """The history of the checkpoint verl resumed from (``global_steps`` after its load), None on a fresh start."""
    if global_steps == 0:
        return None
    if trainer.resume_mode == "resume_path":
        folder = os.path.abspath(trainer.resume_from_path)
    else:
        folder = os.path.join(os.path.abspath(trainer.default_local_dir), f"global_step_{global_steps}")
    return os.path.join(folder, SPECULATION_STATE_DIR)


def save(servers: list, directory: str) -> None:
    """``servers``: the first server of each replica (``rollout_servers.verl_ext_servers``)."""
    states = ray.get([s.speculation_state.remote() for s in servers])
    if any(state is not None for state in states):
        state_files.save_states(directory, states)


def load(servers: list, directory: str) -> None:
    """A state the replica cannot load is refused with its file and the fix."""
    states = state_files.load_states(directory, len(servers))
    if states is None:
        return
    for rank, (server, state) in enumerate(zip(servers, states, strict=True)):
        if state is None:
            continue  # this replica had no history to save
        try:
            ray.get(server.load_speculation_state.remote(state))
        except Exception as error:  # noqa: BLE001 -- a state of the wrong shape: name the file
            path = os.path.join(directory, state_files.replica_file(rank))
            cause = str(error).strip().splitlines()[-1]  # a Ray error carries the actor's traceback
            raise state_files.refuse(path, f"not a drafter history this rollout can load ({cause})") from None
