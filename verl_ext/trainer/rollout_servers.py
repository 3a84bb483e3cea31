"""The rollout servers as the trainer reaches them: the ones that answer verl_ext's calls, and a dead one named as
the cause when training fails."""

from contextlib import contextmanager

from verl_ext.rollout.health import dead_servers, replica_died_error


def verl_ext_servers(replicas: list) -> list:
    """First server of each of verl_ext's replicas (class attribute ``answers_verl_ext``): its HF and vLLM servers
    answer rollout_metrics and speculation_state (a vLLM replica's other servers are headless nodes of the same
    engine). A replica of verl's own (vLLM without verl_ext's rollout keys: vllm/replica_choice.py) answers none."""
    return [replica.servers[0] for replica in replicas if getattr(replica, "answers_verl_ext", False)]


@contextmanager
def dead_server_named(verl_trainer):
    """A failure inside (in a step's rollout, a checkpoint or the weight sync) is raised as the death of a rollout
    server where one died: verl's loop would trip over whatever broke next. ``verl_trainer``: in its ``fit``."""
    try:
        yield
    except Exception as error:
        dead = dead_servers(verl_trainer.llm_server_manager.get_replicas())
        if dead:
            raise replica_died_error(dead, verl_trainer.global_steps) from error
        raise
