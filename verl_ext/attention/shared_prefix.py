"""One group's prompt encoded once for every micro-batch that holds its responses.

When a group is too large for one micro-batch, its prompt runs on its own and each part of its
responses reads the prompt's keys/values instead of encoding the prompt again (schedule-level
shared-prefix reuse, arXiv 2606.01143):

    forward only   encode_prefix (no grad)  ->  parts 1..n read it  ->  dropped
    training       encode_prefix (no grad)  ->  parts 1..n read it, each backward adds its
                   dK, dV (every layer) and d(last logits) into the prefix's leaves
                   ->  backward_prefix: the prefix forward again, with grad, and one backward
                   that feeds it the summed gradients

Exact: a response token's attention over [prompt; itself] is the cross part over the prompt's
keys/values merged by log-sum-exp with its own causal part (kernels/sdpa.py), whichever micro-batch
the cross part's keys come from; and the gradient of a prompt parameter is the sum over the members
(Prefix Grouper, Lemma 2.1), which the leaves collect in pieces and the one prefix backward applies.
The logits at the prompt's last position predict every response's first token; they are a leaf too.

Memory held between micro-batches, for the one group whose parts are running (La attention layers, Lp
prompt tokens, Hkv key/value heads of size D, b bytes per element, V vocabulary; Ls layers with a state along
positions, each a convolution of kernel k over C channels and, for linear attention, a recurrent state of Hv
heads [Dk, Dv] in s bytes per element, fp32 in the kernels: s = 4):
    forward only   P = 2 La Lp Hkv D b + Ls ((k - 1) C b + Hv Dk Dv s) + V b
                   (keys, values; convolution tails, recurrent states; last logits)
    training       2 P                                        (the same and their gradients)
A linear-attention layer's state does not grow with the prompt: on a hybrid model the held memory is the
attention layers' part plus a constant (benchmarks/prefix_grouper.py prints both).
The prefix's activations are not kept between micro-batches: backward_prefix recomputes them (one
more forward over Lp tokens), so the peak is that of one micro-batch plus the above, not of two.
"""

import torch
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from verl_ext.attention.forward import run_grouped
from verl_ext.attention.groups import GroupPlan, PrefixGroup, as_token_list
from verl_ext.attention.kernels import GroupedKernels
from verl_ext.attention.layout import build_grouped_batch
from verl_ext.attention.prefix_state import PrefixStates


class SharedPrefix:
    """A prompt's per-layer states (prefix_state.py: keys/values [1, Hkv, Lp, D] for attention) and the logits at
    its last position [V].

    Filled by one pass over the prompt (every layer records its state); read by the micro-batches of the group's
    responses, whose layers receive the states with their call. Encoded for training, the tensors are leaves that
    collect the gradients of every reader, for `backward_prefix`.
    """

    def __init__(self, prompt: torch.Tensor):
        self.prompt = prompt  # [Lp] token ids, on the model's device
        self.states = PrefixStates()
        self.last_logits: torch.Tensor | None = None  # [V]

    def leaves(self) -> list[torch.Tensor]:
        """Every tensor the readers differentiate: the states layer by layer, then the last logits (none before a
        pass has filled it)."""
        if self.last_logits is None:
            return []
        return [*self.states.tensors(), self.last_logits]

    def check_reader(self, prompt) -> None:
        """A batch that reads this prefix has its prompt."""
        if as_token_list(prompt) != self.prompt.tolist():
            raise ValueError("the batch's prompt is not the shared prefix it would read")


def _prefix_pass(model: PreTrainedModel, prefix: SharedPrefix, kernels: GroupedKernels | None) -> torch.Tensor:
    """Run `prefix.prompt` alone, recording each layer's state into `prefix`; logits at its last position [V]."""
    plan = GroupPlan(groups=(PrefixGroup((0,), len(prefix.prompt), (0,)),), num_samples=1)
    batch = build_grouped_batch(plan, [prefix.prompt.cpu()], [[]]).to(prefix.prompt.device)
    # only the last position's logits: [1, 1, V], not [1, Lp, V]
    out = run_grouped(model, batch, kernels, prefix=prefix.states, logits_to_keep=1)
    logits = out.logits.full_tensor() if isinstance(out.logits, DTensor) else out.logits
    return logits[0, -1]


def encode_prefix(model: PreTrainedModel, prompt: torch.Tensor, trainable: bool,
                  kernels: GroupedKernels | None = None) -> SharedPrefix:
    """The prompt's states and last logits, without grad; leaves that collect gradients if `trainable`."""
    prefix = SharedPrefix(prompt)
    with torch.no_grad():
        prefix.last_logits = _prefix_pass(model, prefix, kernels)
    if trainable:
        for leaf in prefix.leaves():
            leaf.requires_grad_()
    return prefix


def backward_prefix(model: PreTrainedModel, prefix: SharedPrefix, kernels: GroupedKernels | None = None) -> None:
    """Recompute the prompt's forward with grad and backpropagate what the readers accumulated.

    A prefix no reader touched still runs its forward and backward, with zero gradients: data-parallel
    ranks run the same collectives (a rank with nothing to do calls this on a one-token prompt).
    """
    recomputed = SharedPrefix(prefix.prompt)
    recomputed.last_logits = _prefix_pass(model, recomputed, kernels)
    pairs = [(t, leaf.grad) for t, leaf in zip(recomputed.leaves(), prefix.leaves(), strict=False) if leaf.grad is not None]
    if not pairs:
        pairs = [(recomputed.last_logits, torch.zeros_like(recomputed.last_logits))]
    torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
