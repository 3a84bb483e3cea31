"""rollout.name=vllm goes through verl_ext's replica choice: verl's own replica, or verl_ext's where the rollout gives
its keys (which one is built: tests/vllm_engine/test_opt_in_vllm.py, in the vLLM environment)."""


def test_vllm_rollout_name_loads_the_replica_choice():
    import verl  # noqa: F401  (loads verl_ext's plug-in through verl's entry point)
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from verl_ext.registration import VLLM_ROLLOUT, _load_vllm_replica, check_registered

    check_registered()
    # building a replica imports vLLM, so only the registration is checked here
    assert RolloutReplicaRegistry._registry[VLLM_ROLLOUT] is _load_vllm_replica
    from verl_ext.vllm.replica_choice import VllmReplicaChoice

    assert _load_vllm_replica() is VllmReplicaChoice and VllmReplicaChoice.verl_loader.__module__.startswith("verl.")
