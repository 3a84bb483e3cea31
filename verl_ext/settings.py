"""Everything verl_ext reads from a verl config: one schema, each key parsed and validated once.

``read_settings(config)`` turns verl's config into ``Settings``; ``verl_ext.preflight`` runs it before Ray starts,
so a bad key stops the run in seconds with one line naming the key and the fix. A Ray actor that verl hands only
its rollout config (the HF and the vLLM server) runs the same parser on it, ``read_rollout_settings``. Every other
module receives these typed objects.

    section                    class                   keys (relative to the section)
    trainer                    TrainerSettings         device, v1.trainer_mode, v1.sampler.poll_interval,
                                                       total_training_steps, total_epochs, critic_warmup
    actor_rollout_ref.rollout  RolloutSettings         custom.speculation.* (SpeculationConfig), custom.trace_dir,
                                                       full_determinism, free_cache_engine, engine_kwargs.hf.*, ...
    actor_rollout_ref          PrefixGrouperSettings   actor.use_prefix_grouper, the keys it cannot run with, and
                                                       actor.ppo_mini_batch_size (whole groups per mini-batch)
    verl_ext                   ExtensionSettings       data_dir, report_dir, demo_profile, grouped_attention,
                                                       show_logs
    data                       DataSettings            train_batch_size
    algorithm                  AlgorithmSettings       rollout_correction.bypass_mode

Each field names the keys it is read from in ``metadata["keys"]``. ``DECLARED_KEYS`` holds them all, with the
speculation keys and ``VERL_KEYS`` (verl's own keys that verl_ext reads with verl's meaning and verl validates);
tests/test_settings_schema.py checks that no module reads a key missing there, nor a key parsed here from the
raw config.
"""

from __future__ import annotations

import difflib
import logging
import os
import sys
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Literal, Mapping, Optional, get_args

from verl_ext.speculation.config import SAMPLING_KEYS, SpeculationConfig, check_sampling_supported

logger = logging.getLogger(__name__)

Device = Literal["cpu", "cuda", "npu"]
DemoProfile = Literal["full", "long", "hybrid", "hybrid_long", "test"]  # the builds of verl_ext.demo.build.PROFILES
GroupedAttention = Literal["auto", "flash", "flex", "sdpa"]  # the shared-prefix forward's attention kernels
# verl_ext.grouped_attention reaches the training workers as this environment variable (ray_setup.py)
GROUPED_ATTENTION_ENV = "VERL_EXT_GROUPED_ATTENTION"
SPECULATION = "actor_rollout_ref.rollout.custom.speculation"
# the group agent loop's class as configs name it (tests/test_settings_schema.py holds it to the class)
GROUP_AGENT_LOOP = "verl_ext.workers.agent_loop.GroupAgentLoopManager"


class ConfigError(ValueError):
    """A bad setting; the message is one line that names the key and the fix."""


def grouped_attention_backend() -> GroupedAttention:
    """The backend verl_ext.grouped_attention chose for this process ("auto" when unset): ray_setup exports it to the
    workers as GROUPED_ATTENTION_ENV. Read once, by whoever builds the kernels (workers/grouped_engine.py)."""
    backend = os.environ.get(GROUPED_ATTENTION_ENV, "auto")
    if backend not in get_args(GroupedAttention):
        raise ConfigError(f"{GROUPED_ATTENTION_ENV}={backend!r} is not a grouped attention backend; "
                          f"use one of {list(get_args(GroupedAttention))}")
    return backend


def _key(*keys: str, **kwargs):
    """A field read from ``keys`` (dotted, relative to its section's PREFIX)."""
    return field(metadata={"keys": keys}, **kwargs)


@dataclass(frozen=True)
class TrainerSettings:
    """trainer.*: the device, and the knob of verl_ext's trainer."""

    PREFIX: ClassVar[str] = "trainer"
    device: Device = _key("device", default="cpu")
    trainer_mode: str = _key("v1.trainer_mode", default="sync")  # verl's default
    # seconds between checks whether a step's rollouts are done; read by verl_ext's trainer (None: verl's 2 s)
    poll_interval: Optional[float] = _key("v1.sampler.poll_interval", default=None)
    total_training_steps: Optional[int] = _key("total_training_steps", default=None)  # None: verl's, from epochs
    total_epochs: int = _key("total_epochs", default=1)
    critic_warmup: int = _key("critic_warmup", default=0)  # steps before the actor first updates (verl's meaning)

    def __post_init__(self) -> None:
        _check_choice("trainer.device", self.device, Device, "use cuda or cpu.")
        if self.total_training_steps is not None:
            _check_count("trainer.total_training_steps", self.total_training_steps,
                         "or drop it (null) to train for trainer.total_epochs")
        _check_count("trainer.total_epochs", self.total_epochs)
        if isinstance(self.critic_warmup, bool) or not isinstance(self.critic_warmup, int) or self.critic_warmup < 0:
            raise ConfigError(f"trainer.critic_warmup={self.critic_warmup!r} must be a step count >= 0 (verl's default 0).")
        if self.poll_interval is None:
            return
        if not _is_number(self.poll_interval) or not self.poll_interval > 0:
            raise ConfigError(f"trainer.v1.sampler.poll_interval={self.poll_interval} must be > 0 seconds (e.g. 0.05).")


@dataclass(frozen=True)
class RolloutSettings:
    """actor_rollout_ref.rollout: what verl_ext's rollout servers read, and the keys verl_ext adds to it."""

    PREFIX: ClassVar[str] = "actor_rollout_ref.rollout"
    name: Optional[str] = _key("name", default=None)  # verl requires it (its default: ???)
    n: int = _key("n", default=1)  # responses per prompt (GRPO's group)
    val_n: int = _key("val_kwargs.n", default=1)  # responses per prompt in validation
    seed: int = _key("seed", default=0)
    prompt_length: int = _key("prompt_length", default=512)
    response_length: int = _key("response_length", default=512)
    full_determinism: bool = _key("full_determinism", default=False)  # seeds of each request's own
    free_cache_engine: bool = _key("free_cache_engine", default=True)  # HF on an accelerator: offload when asleep
    max_num_seqs: int = _key("max_num_seqs", default=256)  # rows the HF engine decodes at once (the rest queue)
    max_num_batched_tokens: int = _key("max_num_batched_tokens", default=8192)  # prompt tokens per HF prefill
    num_threads: Optional[int] = _key("engine_kwargs.hf.num_threads", default=None)  # HF server; None: all cores
    trace_dir: Optional[str] = _key("custom.trace_dir", default=None)  # one JSONL of finished rollouts per replica
    # None: off (no settings, method none, or full_determinism: rollout/speculation_setup.py says why)
    speculation: Optional[SpeculationConfig] = _key("custom.speculation", default=None)
    speculation_keys: frozenset[str] = _key("custom.speculation", default=frozenset())  # the keys given
    sampling: Mapping[str, Any] = _key(*SAMPLING_KEYS, default_factory=dict)  # the sampling options set
    # what verl's vLLM rollout would run beside speculation (verl_ext.vllm.engine_args.check_rollout)
    data_parallel_size: int = _key("data_parallel_size", "engine_kwargs.vllm.data_parallel_size", default=1)
    engine_speculative_config: bool = _key("engine_kwargs.vllm.speculative_config", default=False)
    mtp_rollout: bool = _key("mtp.enable", "mtp.enable_rollout", default=False)
    disable_log_stats: bool = _key("disable_log_stats", default=True)
    calculate_log_probs: bool = _key("calculate_log_probs", default=False)  # the sampled tokens' log-probs returned
    agent_loop_manager_class: Optional[str] = _key("agent.agent_loop_manager_class", default=None)

    def __post_init__(self) -> None:
        for name in ("full_determinism", "free_cache_engine"):
            _check_bool(f"{self.PREFIX}.{name}", getattr(self, name))
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ConfigError(
                f"{self.PREFIX}.n={self.n!r} is invalid: it is the number of responses per prompt, an integer >= 1 "
                "(GRPO compares the responses of a prompt: use n >= 2, e.g. 8).")
        if self.num_threads is not None and (not isinstance(self.num_threads, int) or self.num_threads < 1):
            raise ConfigError(f"{self.PREFIX}.engine_kwargs.hf.num_threads={self.num_threads!r} is invalid: "
                              "set a thread count >= 1, or drop it to use all cores.")
        for name in ("max_num_seqs", "max_num_batched_tokens", "prompt_length", "response_length"):
            _check_count(f"{self.PREFIX}.{name}", getattr(self, name), f"(verl's default: {getattr(type(self), name)})")
        if self.speculation is not None:
            self._check_speculation()

    def _check_speculation(self) -> None:
        # What a vLLM rollout must not be given besides is the vLLM route's to check (vllm/engine_args.py:
        # check_rollout, run by preflight and by verl_ext's vLLM server): the schema depends on no consumer.
        try:
            check_sampling_supported(self.sampling)
        except ValueError as error:
            raise ConfigError(f"{SPECULATION}: {error}") from None
        if self.name not in ("hf", "vllm"):
            raise ConfigError(
                f"rollout.custom.speculation is served by rollout.name=hf or vllm, not {self.name}; set "
                f"{SPECULATION}.method=none or use one of those rollouts.")


_ULYSSES = "ulysses_sequence_parallel_size"


@dataclass(frozen=True)
class PrefixGrouperSettings:
    """actor.use_prefix_grouper (actor and reference model), refused with what the shared-prefix engine does not do."""

    PREFIX: ClassVar[str] = "actor_rollout_ref"
    enabled: bool = _key("actor.use_prefix_grouper", default=False)
    strategy: str = _key("actor.strategy", default="fsdp")
    # key -> size, for each place verl reads a Ulysses size from
    ulysses_sizes: Mapping[str, int] = _key(
        *(f"{role}.{where}{_ULYSSES}" for role in ("actor", "ref") for where in ("", "fsdp_config.")),
        default_factory=dict)
    use_fused_kernels: bool = _key("model.use_fused_kernels", default=False)
    # the update's extra outputs the grouped forward does not produce (verl's engine reads them per micro-batch)
    sum_pi_squared: bool = _key("actor.calculate_sum_pi_squared", default=False)
    pad_to_length: Mapping[str, bool] = _key("actor.fsdp_config.pad_to_length", "ref.fsdp_config.pad_to_length",
                                             default_factory=dict)  # key -> value
    # prompts per update mini-batch (verl's meaning and default): whole groups are placed per mini-batch
    mini_batch_size: int = _key("actor.ppo_mini_batch_size", default=256)
    # tokens per micro-batch under use_dynamic_bsz (verl's default)
    token_budget: int = _key("actor.ppo_max_token_len_per_gpu", default=16384)

    def __post_init__(self) -> None:
        flag = f"{self.PREFIX}.actor.use_prefix_grouper"
        _check_bool(flag, self.enabled)
        if not self.enabled:
            return
        flag += "=true"
        if self.strategy not in ("fsdp", "fsdp2"):
            raise ConfigError(f"{flag} needs {self.PREFIX}.actor.strategy fsdp or fsdp2, got {self.strategy}; "
                              "change one of them.")
        for key, size in self.ulysses_sizes.items():
            if (size or 1) > 1:
                raise ConfigError(f"{flag} does not support Ulysses sequence parallelism ({self.PREFIX}.{key}={size}); "
                                  "set it to 1 or turn use_prefix_grouper off.")
        if self.use_fused_kernels:
            raise ConfigError(
                f"{flag} does not support {self.PREFIX}.model.use_fused_kernels=true (the fused kernel never "
                "materialises the logits the grouped forward selects); set one of them to false.")
        for key, on in self.pad_to_length.items():
            if on:
                raise ConfigError(f"{flag} does not support {self.PREFIX}.{key}=true; set it to false.")
        if self.sum_pi_squared:
            raise ConfigError(f"{flag} does not support {self.PREFIX}.actor.calculate_sum_pi_squared=true (the grouped "
                              "forward does not compute it); set one of them to false.")
        _check_count(f"{self.PREFIX}.actor.ppo_mini_batch_size", self.mini_batch_size, "(verl's default: 256)")


@dataclass(frozen=True)
class ExtensionSettings:
    """verl_ext.*: the embedded default's build and the step report."""

    PREFIX: ClassVar[str] = "verl_ext"
    # where the embedded default is read from: null, the builds shipped in the package; a folder, a build of your own
    # there (built on first use)
    data_dir: Optional[str] = _key("data_dir", default=None)
    report_dir: Optional[str] = _key("report_dir", default=None)  # per-step metrics (JSONL), summary and plot
    demo_profile: DemoProfile = _key("demo_profile", default="full")  # the build of the embedded default
    # the shared-prefix forward's kernel: auto = flash-attn where installed on CUDA, else FlexAttention; sdpa on CPU
    grouped_attention: GroupedAttention = _key("grouped_attention", default="auto")
    # with a step report: Ray's and the workers' logs live on the terminal (true) or in report_dir/run.log (false)
    show_logs: bool = _key("show_logs", default=False)

    def __post_init__(self) -> None:
        _check_choice("verl_ext.grouped_attention", self.grouped_attention, GroupedAttention,
                      "auto picks the fastest that runs (flash, flex, sdpa).")
        _check_bool("verl_ext.show_logs", self.show_logs)
        if self.demo_profile not in get_args(DemoProfile):
            raise ConfigError(
                f"verl_ext.demo_profile={self.demo_profile!r} is not a build of the embedded default; choose one of "
                f"{sorted(get_args(DemoProfile))} (long: demo_cpu_long's answers of ~240 tokens; hybrid: "
                "demo_cpu_hybrid's Qwen3.5-shaped policy; hybrid_long: the long answers on it).")


@dataclass(frozen=True)
class DataSettings:
    """data.*: the batch verl_ext's trainer counts samples of."""

    PREFIX: ClassVar[str] = "data"
    train_batch_size: int = _key("train_batch_size", default=1024)  # prompts per step
    max_prompt_length: int = _key("max_prompt_length", default=512)
    max_response_length: int = _key("max_response_length", default=512)

    def __post_init__(self) -> None:
        _check_count(f"{self.PREFIX}.train_batch_size", self.train_batch_size, "(prompts per step)")


@dataclass(frozen=True)
class AlgorithmSettings:
    """algorithm.*: whether the old log-probs are the rollout's (verl's bypass mode), which needs them returned."""

    PREFIX: ClassVar[str] = "algorithm"
    bypass_mode: bool = _key("rollout_correction.bypass_mode", default=False)

    def __post_init__(self) -> None:
        _check_bool(f"{self.PREFIX}.rollout_correction.bypass_mode", self.bypass_mode)


@dataclass(frozen=True)
class DistillationSettings:
    """distillation.*: only whether it is on (the shared-prefix forward does not serve it)."""

    PREFIX: ClassVar[str] = "distillation"
    enabled: bool = _key("enabled", default=False)

    def __post_init__(self) -> None:
        _check_bool(f"{self.PREFIX}.enabled", self.enabled)


@dataclass(frozen=True)
class LoraSettings:
    """actor_rollout_ref.model's LoRA (verl's keys): the grouped forward runs through verl's peft adapters; the HF
    rollout takes the actor's weights whole, so verl must merge the adapters into them at each sync."""

    PREFIX: ClassVar[str] = "actor_rollout_ref.model"
    rank: int = _key("lora_rank", default=0)
    merge: bool = _key("lora.merge", default=False)


@dataclass(frozen=True)
class Settings:
    trainer: TrainerSettings
    rollout: RolloutSettings
    prefix_grouper: PrefixGrouperSettings
    extension: ExtensionSettings
    data: DataSettings
    distillation: DistillationSettings = field(default_factory=DistillationSettings)
    algorithm: AlgorithmSettings = field(default_factory=AlgorithmSettings)
    lora: LoraSettings = field(default_factory=LoraSettings)

    def __post_init__(self) -> None:
        where = RolloutSettings.PREFIX
        if (self.lora.rank or 0) > 0 and self.rollout.name == "hf" and not self.lora.merge:
            # unmerged, verl sends the adapters apart (vLLM's LoRA), under names the HF model does not have
            raise ConfigError(
                f"{LoraSettings.PREFIX}.lora_rank={self.lora.rank} with {where}.name=hf: the HF rollout takes the "
                f"actor's weights whole; set {LoraSettings.PREFIX}.lora.merge=true (verl merges the adapters into "
                "them at each weight sync) or use rollout.name=vllm.")
        if self.algorithm.bypass_mode and not self.rollout.calculate_log_probs:
            # verl's trainer copies the rollout's log-probs as the old ones, and would find none at the first step
            raise ConfigError(
                f"{AlgorithmSettings.PREFIX}.rollout_correction.bypass_mode=true takes the old log-probs from the "
                f"rollout, and {where}.calculate_log_probs=false returns none; set calculate_log_probs=true (or "
                "bypass_mode=false, which recomputes them in the actor).")
        if self.rollout.name == "vllm" and self.rollout.full_determinism and self.trainer.device == "cpu":
            # vLLM 0.24.0's CPU workers fail every seeded request ("CPU Generator does not use offset"), the engine
            # dies, and verl's replay buffer resubmits the step's prompts without end
            raise ConfigError(
                f"{where}.full_determinism=true needs seeded sampling, which vLLM's CPU backend cannot do; "
                f"for a deterministic run on CPU use {where}.name=hf (or run vLLM on GPU).")
        self._check_grouped_attention()
        self._check_trainer_mode()
        self._check_batches()
        if self.prefix_grouper.enabled and self.distillation.enabled:
            # verl's distillation losses read top-k teacher outputs per token that the grouped forward does not make
            raise ConfigError(f"{PrefixGrouperSettings.PREFIX}.actor.use_prefix_grouper=true does not support "
                              "distillation (distillation.enabled=true); turn one of them off.")
        if self.rollout.n == 1 and self.prefix_grouper.enabled:
            logger.warning(f"{where}.n=1 with use_prefix_grouper=true: each prompt has one response, so "
                           "there is no prefix to share; the grouped forward computes what the standard one does.")

    def trainer_features(self) -> list[str]:
        """The settings given that verl_ext's trainer serves (verl's sync trainer with verl_ext's workers, agent loop
        wake-ups, metrics and drafter checkpoints: verl_ext/trainer): verl's own trainer would leave the grouper
        silently off (verl's workers never read it), and cannot train on CPU (its workers' process group and engines
        are CUDA's and NPU's). Empty: verl's own trainer runs the job (verl_ext/trainer_modes.py)."""
        rollout = RolloutSettings.PREFIX
        return [key for key, given in (
            ("trainer.device=cpu", self.trainer.device == "cpu"),
            (f"{PrefixGrouperSettings.PREFIX}.actor.use_prefix_grouper=true", self.prefix_grouper.enabled),
            (f"{rollout}.agent.agent_loop_manager_class={GROUP_AGENT_LOOP}",
             self.rollout.agent_loop_manager_class == GROUP_AGENT_LOOP),
            (f"{SPECULATION}.method={self.rollout.speculation and self.rollout.speculation.method}",
             self.rollout.speculation is not None),
            (f"{rollout}.name=hf", self.rollout.name == "hf"),
            ("trainer.v1.sampler.poll_interval", self.trainer.poll_interval is not None)) if given]

    def _check_trainer_mode(self) -> None:
        """verl_ext's trainer is verl's sync trainer: under verl's async modes what it serves is refused."""
        needs = self.trainer_features()
        if self.trainer.trainer_mode in SERVED_TRAINER_MODES or not needs:
            return
        raise ConfigError(
            f"{', '.join(needs)}: verl_ext serves {'it' if len(needs) == 1 else 'them'} under trainer.v1.trainer_mode="
            f"sync (verl's synchronous trainer), not {self.trainer.trainer_mode}; set trainer.v1.trainer_mode=sync "
            f"or turn {'it' if len(needs) == 1 else 'them'} off.")

    def _check_batches(self) -> None:
        """What verl's update would meet after the embedded default is built: a step's prompts that whole
        mini-batches cannot hold (with the shared prefix each holds whole groups), a token budget below a sample."""
        actor, grouper, data = f"{PrefixGrouperSettings.PREFIX}.actor", self.prefix_grouper, self.data
        if grouper.enabled and data.train_batch_size % grouper.mini_batch_size:
            raise ConfigError(
                f"data.train_batch_size={data.train_batch_size} prompts do not split into mini-batches of "
                f"{actor}.ppo_mini_batch_size={grouper.mini_batch_size} (with use_prefix_grouper=true each update "
                "mini-batch holds whole prompt groups); make train_batch_size a multiple of ppo_mini_batch_size.")
        if not all(isinstance(n, int) for n in (data.max_prompt_length, data.max_response_length)):
            return  # verl's own check says what these must be
        # a shared prefix runs a prompt apart from its responses, so each must fit; verl's forward needs both at once
        longest = (max(data.max_prompt_length, data.max_response_length) if grouper.enabled
                   else data.max_prompt_length + data.max_response_length)
        _check_count(f"{actor}.ppo_max_token_len_per_gpu", grouper.token_budget, "(tokens per micro-batch)")
        if grouper.token_budget < longest:
            what = "the longer of" if grouper.enabled else "the sum of"
            raise ConfigError(
                f"{actor}.ppo_max_token_len_per_gpu={grouper.token_budget} is below {what} data.max_prompt_length="
                f"{data.max_prompt_length} and data.max_response_length={data.max_response_length} ({longest} "
                "tokens): a sample would fit no micro-batch; raise it to at least that.")

    def _check_grouped_attention(self) -> None:
        """A kernel verl_ext.grouped_attention names that the device cannot run is refused (whether flash-attn is
        installed is the environment's question: preflight.check_before_data)."""
        key, backend = "verl_ext.grouped_attention", self.extension.grouped_attention
        if backend in ("flash", "flex") and self.trainer.device == "cpu":
            raise ConfigError(f"{key}={backend} needs CUDA ({'flash-attn' if backend == 'flash' else 'FlexAttention'}"
                              " has no CPU backward); on trainer.device=cpu use sdpa or auto.")


# verl's trainer modes (trainer.v1.trainer_mode) in which verl_ext's trainer serves what it serves: verl's sync trainer
# under its own name or under verl_ext's (the recipes' until session 45)
SERVED_TRAINER_MODES = ("sync", "verl_ext")


def verl_ext_keys(config) -> list[str]:
    """The keys of a verl config (unresolved, unchecked) that turn verl_ext on; empty for a job verl_ext leaves to
    verl as it is. Read before any check: a job that turns nothing of verl_ext on is never refused by it."""
    rollout = RolloutSettings.PREFIX
    return [key for key, given in (
        ("trainer.device=cpu", _get(config, "trainer.device") == "cpu"),
        ("actor_rollout_ref.actor.use_prefix_grouper", _get(config, "actor_rollout_ref.actor.use_prefix_grouper")
         not in (None, False)),
        (f"{rollout}.agent.agent_loop_manager_class", str(_get(config, f"{rollout}.agent.agent_loop_manager_class"))
         .startswith("verl_ext.")),
        (f"{rollout}.name=hf", _get(config, f"{rollout}.name") == "hf"),
        ("trainer.v1.trainer_mode=verl_ext", _get(config, "trainer.v1.trainer_mode") == "verl_ext"),
        ("trainer.v1.sampler.poll_interval", _get(config, "trainer.v1.sampler.poll_interval") is not None),
        (ExtensionSettings.PREFIX, _get(config, ExtensionSettings.PREFIX) is not None)) if given] + verl_ext_rollout(
        _get(config, rollout))


def verl_ext_rollout(rollout) -> list[str]:
    """The keys verl_ext adds under ``actor_rollout_ref.rollout.custom`` that a rollout config gives (method none
    included), and any key one typo away from them (which the checks then refuse): a vLLM rollout with any of them
    runs verl_ext's server (vllm/replica_choice.py)."""
    custom = _plain(_get(rollout, "custom")) or {}
    return [f"{RolloutSettings.PREFIX}.custom.{key}" for key, value in custom.items()
            if value is not None and (key in _CUSTOM_KEYS or _typo_of(key, _CUSTOM_KEYS))]


# ---- the parser ---------------------------------------------------------------------------------------------


def read_settings(config) -> Settings:
    """verl's whole config (unresolved is fine: no key here points at the embedded default's build)."""
    return Settings(
        trainer=read_trainer_settings(_get(config, TrainerSettings.PREFIX)),
        rollout=read_rollout_settings(_get(config, RolloutSettings.PREFIX)),
        prefix_grouper=read_prefix_grouper(_get(config, PrefixGrouperSettings.PREFIX)),
        extension=read_extension_settings(_get(config, ExtensionSettings.PREFIX)),
        data=_read(DataSettings, _get(config, DataSettings.PREFIX)),
        distillation=_read(DistillationSettings, _get(config, DistillationSettings.PREFIX)),
        algorithm=_read(AlgorithmSettings, _get(config, AlgorithmSettings.PREFIX)),
        lora=_read(LoraSettings, _get(config, LoraSettings.PREFIX)),
    )


def read_trainer_settings(trainer) -> TrainerSettings:
    return _read(TrainerSettings, trainer)


def read_extension_settings(section) -> ExtensionSettings:
    return _read(ExtensionSettings, _known(section, ExtensionSettings.PREFIX, _field_keys(ExtensionSettings)))


def read_rollout_settings(rollout) -> RolloutSettings:
    """actor_rollout_ref.rollout: verl's DictConfig, or the RolloutConfig verl hands a rollout server. Under
    ``custom``, verl's open extension point, verl_ext reads its own keys and leaves any other to whoever reads it."""
    custom = _plain(_get(rollout, "custom")) or {}
    _check_near_misses(custom, f"{RolloutSettings.PREFIX}.custom", _CUSTOM_KEYS)
    given = _known(custom.get("speculation"), SPECULATION, [f.name for f in fields(SpeculationConfig)])
    _known(_get(rollout, "engine_kwargs.hf"), f"{RolloutSettings.PREFIX}.engine_kwargs.hf", ["num_threads"])
    vllm_kwargs = _get(rollout, "engine_kwargs.vllm")
    return _read(
        RolloutSettings, rollout,
        speculation=_speculation(given, _get(rollout, "full_determinism") is True),
        speculation_keys=frozenset(given),
        sampling={key: _plain(_get(rollout, key)) for key in SAMPLING_KEYS if _get(rollout, key) is not None},
        data_parallel_size=max(int(_get(rollout, "data_parallel_size") or 1),
                               int(_get(vllm_kwargs, "data_parallel_size") or 1)),
        engine_speculative_config=bool(_get(vllm_kwargs, "speculative_config")),
        mtp_rollout=bool(_get(rollout, "mtp.enable") and _get(rollout, "mtp.enable_rollout")),
    )


def read_prefix_grouper(actor_rollout_ref) -> PrefixGrouperSettings:
    """actor_rollout_ref, as verl's driver holds it or verl hands it to the actor/rollout/reference worker."""
    multi = {f.name: {key: _get(actor_rollout_ref, key) for key in f.metadata["keys"]}
             for f in fields(PrefixGrouperSettings) if len(f.metadata["keys"]) > 1}
    return _read(PrefixGrouperSettings, actor_rollout_ref, **multi)


def _speculation(given: dict, full_determinism: bool) -> Optional[SpeculationConfig]:
    if not given:
        return None
    try:
        config = SpeculationConfig(**given)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{SPECULATION}: {error}") from None
    if config.method != "none" and full_determinism:
        logger.warning("rollout.full_determinism: speculation is off (a seeded request's tokens follow its drafts, "
                       "and drafts follow how the step's requests arrive); rollouts repeat, without its speed-up")
        return None
    return None if config.method == "none" else config


# ---- reading a section --------------------------------------------------------------------------------------


def _read(cls, section, **derived):
    """``cls`` from ``section``: each field from its one key, unless ``derived`` gives it (several keys)."""
    values = {}
    for f in fields(cls):
        if f.name not in derived:
            (key,) = f.metadata["keys"]
            values[f.name] = _plain(_get(section, key, None if f.default is MISSING else f.default))
    return cls(**values, **derived)


def _get(section, key: str, default=None):
    """``section``'s value at dotted ``key``: DictConfig, dict and verl's config dataclasses alike."""
    for name in key.split("."):
        if section is None:
            return default
        section = section.get(name)
    return default if section is None else section


def _known(section, where: str, known) -> dict:
    """``section`` as a plain dict; a key verl_ext does not read is refused, never ignored."""
    values = _plain(section) or {}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown keys {unknown} under {where}; verl_ext reads {sorted(known)}.")
    return values


_CUSTOM_KEYS = ("speculation", "trace_dir")  # verl_ext's keys under verl's open rollout.custom
_NEAR_MISS = 0.8  # difflib's similarity from which a key is taken for a typo of one of verl_ext's


def _typo_of(key: str, ours) -> Optional[str]:
    """The key of ``ours`` that ``key`` is one typo away from, if any."""
    close = difflib.get_close_matches(key, ours, n=1, cutoff=_NEAR_MISS)
    return close[0] if close else None


def _check_near_misses(section: dict, where: str, ours) -> None:
    """A key one typo away from one of ``ours`` is refused (it would silently leave a feature off); any other key
    is someone else's to read."""
    for key in set(section) - set(ours):
        meant = _typo_of(key, ours)
        if meant:
            raise ConfigError(f"{where}.{key} is not a key of verl_ext's; did you mean {where}.{meant}? (other "
                              f"keys under {where} are left to verl)")


def _plain(value):
    # omegaconf is verl's, read only if already imported: a value can be an omegaconf container only then, and the
    # torch-only paths (the shared-prefix forward on a bare CUDA machine) import this module without it.
    omegaconf = sys.modules.get("omegaconf")
    if omegaconf is not None and isinstance(value, (omegaconf.DictConfig, omegaconf.ListConfig)):
        return omegaconf.OmegaConf.to_container(value, resolve=True)
    return value


def _field_keys(cls) -> list[str]:
    return [key for f in fields(cls) for key in f.metadata["keys"]]


def _check_bool(key: str, value) -> None:
    # a value such as `maybe` is truthy: without this it would silently switch a feature on
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} is not a boolean; set it to true or false.")


def _check_choice(key: str, value, choices, fix: str) -> None:
    if value not in get_args(choices):
        raise ConfigError(f"{key}={value} is not supported; {fix}")


def _check_count(key: str, value, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}={value!r} is invalid: set an integer >= 1{' ' + hint if hint else ''}.")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ---- the keys ---------------------------------------------------------------------------------------------------

# verl's own keys that verl_ext's modules read with verl's meaning (verl validates them): the start-up checks
# of paths and Ray, the rollout servers, the trainer and the workers.
VERL_KEYS = frozenset({
    "actor_rollout_ref.model.path", "actor_rollout_ref.model.override_config.attn_implementation",
    "data.train_files", "data.val_files", "reward.custom_reward_function.path",
    "trainer.nnodes", "trainer.n_gpus_per_node", "trainer.logger",
    "trainer.default_local_dir", "trainer.resume_mode", "trainer.resume_from_path",
    "ray_kwargs.ray_init.address", "ray_kwargs.ray_init.num_cpus", "ray_kwargs.ray_init.num_gpus",
    "ray_kwargs.ray_init.runtime_env.env_vars.TQ_NUM_THREADS",
    "actor_rollout_ref.rollout.dtype", "actor_rollout_ref.rollout.load_format",
    "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.rollout.pipeline_model_parallel_size",
})

SECTIONS = (TrainerSettings, RolloutSettings, PrefixGrouperSettings, ExtensionSettings, DataSettings,
            AlgorithmSettings, LoraSettings)
# every key parsed here, with its section's prefix
PARSED_KEYS = frozenset(f"{cls.PREFIX}.{key}" for cls in SECTIONS for key in _field_keys(cls))
DECLARED_KEYS = PARSED_KEYS | VERL_KEYS | {f"{SPECULATION}.{f.name}" for f in fields(SpeculationConfig)}
