"""Block-parallel GDN verification with one-launch accepted-state reconstruction (issue 3).

    gdn_verify        one layer: outputs of every verified token from the committed states; writes no state, except
                      with `GDNFold`: the previous step's pending ssm update is applied first (and stored)
    gdn_reconstruct   all layers, one launch: committed ssm and/or conv states -> state after the accepted tokens
    naive_*           sequential float64 references
"""
from .naive import naive_gdn_reconstruct, naive_gdn_verify
from .reconstruct import default_reconstruct_config, gdn_reconstruct
from .verify import VerifyConfig, default_verify_config, gdn_verify, write_tuned_verify_configs
from .workspace import MAX_VERIFY_LEN, GDNFold, GDNStateTable, GDNVerifyWorkspace

__all__ = [
    "MAX_VERIFY_LEN",
    "VerifyConfig",
    "default_verify_config",
    "default_reconstruct_config",
    "GDNFold",
    "GDNStateTable",
    "GDNVerifyWorkspace",
    "gdn_reconstruct",
    "gdn_verify",
    "naive_gdn_reconstruct",
    "naive_gdn_verify",
    "write_tuned_verify_configs",
]
