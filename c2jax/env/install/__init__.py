"""Auto-install (`c2jax tasks install`): a repository's own tests made runnable in a
reusable environment layer, installed through an egress allowlist.

  install(folder_or_sdist, InstallConfig(...)) -> InstallResult (ok, layer, test_command)
  AllowlistProxy(hosts): the only way out of an install sandbox (egress.py)
  proposers: 'heuristic' | 'model' (proposer.py)
"""

from c2jax.env.install.egress import AllowlistProxy
from c2jax.env.install.proposer import Plan, make_proposer, proposer_names
from c2jax.env.install.runner import InstallConfig, InstallResult, install, tree_hash

__all__ = ['AllowlistProxy', 'InstallConfig', 'InstallResult', 'Plan', 'install',
           'make_proposer', 'proposer_names', 'tree_hash']
