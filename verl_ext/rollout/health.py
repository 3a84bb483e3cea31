"""Is every rollout server still there? Asked when training fails (a step, a checkpoint, a weight sync), so
the error names the replica that died and why, instead of whatever the loop tripped over next (verl's agent loop
logs one error per request, and its replay buffer reports groups without trajectories)."""

from dataclasses import dataclass

import ray
from ray.exceptions import GetTimeoutError, RayActorError

PING_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class DeadServer:
    replica_rank: int
    server_index: int  # a vLLM replica spanning nodes has one server per node
    cause: str


class RolloutReplicaDied(RuntimeError):
    pass


def dead_servers(replicas, timeout_s: float = PING_TIMEOUT_S) -> list[DeadServer]:
    """Every server of every replica is asked for its address (a method verl's and verl_ext's servers both
    answer at once); the ones that are gone, or do not answer within ``timeout_s``, are listed."""
    pings = [(rank, index, server.get_server_address.remote())
             for rank, replica in enumerate(replicas) for index, server in enumerate(replica.servers)]
    dead = []
    for rank, index, ping in pings:
        try:
            ray.get(ping, timeout=timeout_s)
        except RayActorError as error:
            dead.append(DeadServer(rank, index, _first_lines(str(error))))
        except GetTimeoutError:
            dead.append(DeadServer(rank, index, f"it did not answer a ping within {timeout_s:.0f} s (hung)"))
    return dead


def replica_died_error(dead: list[DeadServer], step: int) -> RolloutReplicaDied:
    lines = [f"rollout replica {d.replica_rank} (server {d.server_index}) is gone: {d.cause}" for d in dead]
    return RolloutReplicaDied(
        f"training step {step} stopped because a rollout server died:\n  " + "\n  ".join(lines) +
        "\nFix: find why in the replica's log (a killed process, an out-of-memory kill, a crash), then resume from "
        "the last checkpoint (trainer.resume_mode=auto keeps the data order and the drafter history)."
    )


def _first_lines(message: str, count: int = 8) -> str:
    """Ray's actor errors run to a page: the actor's name, pid and address and the exit's cause come first."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return " ".join(lines[:count])
