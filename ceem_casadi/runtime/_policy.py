"""The long-record policy: every length threshold that switches a step to its long-record form, in one
place; each switch gives the same optimum to rounding (table: docs/long_records.md). Read the values at
call time (``policy.CHUNK_FROM``) so that a test can lower them by patching this module."""
from __future__ import annotations

CHUNK_FROM = 20_000
CHUNK_LENGTH = 2_000
PIECE_FROM = 20_000
PIECE_LENGTH = 20_000
LEARN_CHUNK_FROM = 50_000
LEARN_CHUNK = 4096
JOINT_CHUNK = 20_000
SELECT_STEPS = 20_000
BATCHED_MIN_TRAJECTORIES = 1
BATCH_COLUMNS = 20_000
CALL_COLUMNS = 2_000
WARM_FROM = 100_000
WARM_LENGTH = 20_000
INIT_SAMPLES = 100_000
REFINE_SAMPLES = 20_000
SEARCH_SAMPLES = 20_000

FROM_POLICY = -1  # a function argument whose default is "the policy's value" (read at call time)

THRESHOLDS = ("CHUNK_FROM", "PIECE_FROM", "LEARN_CHUNK_FROM", "JOINT_CHUNK", "SELECT_STEPS")
