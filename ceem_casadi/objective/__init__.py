"""What CE-EM optimises: the joint log-density J(x_{1:T}, theta), its per-stage pieces with exact
derivatives, and sums of many terms that do not depend on how they are split into shards."""
from ._log_density import joint_log_density
from ._stages import StageFunctions

__all__ = ["StageFunctions", "joint_log_density"]
