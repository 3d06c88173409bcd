"""Reconstruction for short verify blocks (workspace max_len <= 4): placeholder until a measured form lands.

`gdn_reconstruct` offers every plain call (parts="all", default launch config, no workspace_rows) here first;
`reconstruct_short` returns False when it does not handle the call, and the general kernel runs.
"""
import torch

from .workspace import GDNStateTable, GDNVerifyWorkspace


def reconstruct_short(
    states: GDNStateTable,
    workspace: GDNVerifyWorkspace,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor,
    cu_seqlens: torch.Tensor,
) -> bool:
    """Advance the states as `gdn_reconstruct` does, if this form applies; True when done (inputs already checked)."""
    return False
