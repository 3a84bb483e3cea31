"""rollout.name=vllm builds verl_ext's vLLM replica (verl's, with rollout.custom.speculation wired in)."""


def test_vllm_rollout_name_loads_verl_ext_replica():
    import verl  # noqa: F401  (loads verl_ext's plug-in through verl's entry point)
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from verl_ext.registration import VLLM_ROLLOUT, _load_vllm_replica, check_registered

    check_registered()
    # the loader itself imports vLLM, so only its registration is checked here
    assert RolloutReplicaRegistry._registry[VLLM_ROLLOUT] is _load_vllm_replica
