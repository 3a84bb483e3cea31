"""Two gloo ranks, FSDP2 over both: grouped engine == standard engine (run by test_grouped_engine.py).

    python -m torch.distributed.run --nproc_per_node=2 tests/workers/two_ranks.py MODEL_DIR OUT_DIR

The ranks get different groups, so a rank on its own would plan a different number of micro-batches
(rank 1 needs 3 for the token budget, rank 0 only 2): the counts must be agreed on, or FSDP's
collectives would hang. Writes OUT_DIR/rank{r}.txt: "equal", or the tensors that differ.
"""

import functools
import sys
from pathlib import Path

import torch
from engine_testing import actor_rollout_ref_config, build_actor, engine_result, rollout_batch, violations

GROUPS = {
    0: [("a", 24, [5, 7, 3, 6, 1]), ("b", 9, [4, 0, 6]), ("c", 1, [3]), ("b", 5, [2, 0]), ("d", 24, [2])],
    1: [("e", 40, [10, 10]), ("f", 30, [10, 10]), ("g", 20, [5] * 8)],
}
BATCHINGS = [
    dict(use_remove_padding=True, use_dynamic_bsz=True, max_token_len_per_gpu=60),
    dict(use_remove_padding=False, use_dynamic_bsz=False, micro_batch_size_per_gpu=4),
]


def main(model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    arr = actor_rollout_ref_config(Path(model_dir), "actor_rollout_ref.actor.use_kl_loss=true")
    actors = [build_actor(arr, use_prefix_grouper=flag) for flag in (False, True)]
    rank = torch.distributed.get_rank()
    make_batch = functools.partial(rollout_batch, GROUPS[rank], seed=rank, temperature=0.8)
    bad = []
    for batching in BATCHINGS:
        standard, grouped = (engine_result(actor, make_batch, **batching) for actor in actors)
        bad += [f"{batching}: {v}" for v in violations(grouped, standard)]
    Path(out_dir, f"rank{rank}.txt").write_text("\n".join(bad) or "equal")


if __name__ == "__main__":
    main(*sys.argv[1:])
