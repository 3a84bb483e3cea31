"""Speculative decoding for the HF engine: drafter + exact verifier + prefetch behind ``Speculator``."""


def build_speculator(rollout_config):
    settings = (rollout_config.custom or {}).get("speculation") or {}
    if settings.get("method", "none") == "none":
        return None
    raise NotImplementedError("speculation is being wired into the HF engine")
