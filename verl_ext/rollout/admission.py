"""Which queued requests the HF engine admits, and in how many prefill forwards.

verl's ``rollout.max_num_seqs`` caps the rows the engine decodes at once (the rest wait in the server's queue,
in arrival order) and ``rollout.max_num_batched_tokens`` caps the prompt tokens one prefill forward carries,
as in vLLM. The engine prefills each distinct prompt of a forward once, left-padded to the longest, so a
forward costs (distinct prompts) x (longest prompt) tokens; the samples of one prompt are admitted together so
that they share it.
"""

from collections.abc import Hashable, Sequence


def prefill_chunks(prompts: Sequence[Sequence[int]], token_budget: int) -> list[int]:
    """Sizes of consecutive chunks of ``prompts``, one prefill forward each, every chunk within ``token_budget``
    unless a single prompt alone exceeds it (it then runs on its own)."""
    sizes: list[int] = []
    distinct: set[tuple[int, ...]] = set()
    width = 0
    for prompt in prompts:
        key = tuple(prompt)
        if key not in distinct:
            if distinct and (len(distinct) + 1) * max(width, len(key)) > token_budget:
                distinct, width = set(), 0
                sizes.append(0)
            distinct.add(key)
            width = max(width, len(key))
        if not sizes:
            sizes.append(0)
        sizes[-1] += 1
    return sizes


def admission_order(prompt_keys: Sequence[Hashable], room: int) -> list[int]:
    """Positions in the queue of the requests to admit: the oldest first, each followed by the later requests with
    the same prompt (a GRPO group's samples, which may arrive apart), until ``room`` are chosen."""
    members: dict[Hashable, list[int]] = {}
    for position, key in enumerate(prompt_keys):
        members.setdefault(key, []).append(position)
    order: list[int] = []
    for key in prompt_keys:
        if len(order) >= room:
            break
        order += members.pop(key, [])
    return order[:max(0, room)]
