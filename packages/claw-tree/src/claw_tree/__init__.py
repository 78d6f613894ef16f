"""claw-tree: prefix trees over recorded calls, tree-aware advantages, tree-packed samples."""

from importlib.metadata import version as _version

from claw_tree.advantages import (
    gae_on_tree,
    group_relative_advantages,
    linear_scan,
    mean_child_recurrence,
    reinforce_advantages,
    rloo_advantages,
    turn_gae_on_tree,
    turn_starts,
)
from claw_tree.augment import swap_copied_numbers
from claw_tree.corpus import CallIndex, index_calls, stream_file_samples, stream_indexed_samples
from claw_tree.errors import BudgetError, ClawError, ConflictError, RecordError, ValuesError
from claw_tree.options import SampleOptions
from claw_tree.records import Call, Outcome, ReadResult, read_calls, read_outcomes, write_jsonl
from claw_tree.routing import (
    ROUTING_MAGIC,
    RoutingRef,
    RoutingStore,
    load_routing,
    read_sample_routing,
)
from claw_tree.samples import (
    SampleBatch,
    build_samples,
    gae_for_samples,
    make_samples,
    sample_rewards,
    token_sessions,
)
from claw_tree.sft import build_sft_samples
from claw_tree.stats import forest_stats, session_stats
from claw_tree.tree import (
    Forest,
    SessionTree,
    Trajectory,
    build_forest,
    trajectory_record,
    trajectory_spans,
)

__version__ = _version("claw-tree")
__all__ = [
    "BudgetError",
    "Call",
    "CallIndex",
    "ClawError",
    "ConflictError",
    "Forest",
    "Outcome",
    "ReadResult",
    "ROUTING_MAGIC",
    "RecordError",
    "RoutingRef",
    "RoutingStore",
    "SampleBatch",
    "SampleOptions",
    "SessionTree",
    "Trajectory",
    "ValuesError",
    "__version__",
    "build_forest",
    "build_samples",
    "build_sft_samples",
    "forest_stats",
    "gae_for_samples",
    "gae_on_tree",
    "group_relative_advantages",
    "index_calls",
    "linear_scan",
    "load_routing",
    "make_samples",
    "mean_child_recurrence",
    "read_calls",
    "read_outcomes",
    "read_sample_routing",
    "reinforce_advantages",
    "rloo_advantages",
    "sample_rewards",
    "session_stats",
    "swap_copied_numbers",
    "stream_file_samples",
    "stream_indexed_samples",
    "token_sessions",
    "trajectory_record",
    "trajectory_spans",
    "turn_gae_on_tree",
    "turn_starts",
    "write_jsonl",
]
