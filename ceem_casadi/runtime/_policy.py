"""The long-record policy: every length threshold that switches a step to its long-record form,
named in one place (issue 23, item 7). Each switch gives the same optimum as the plain path (to
rounding): only memory, build time and speed change. ``docs/long_records.md`` has the table.

Users read the values at call time (``policy.CHUNK_FROM``, never ``from ... import CHUNK_FROM``),
so that a test can lower them all by patching this module.

=================  =========  ===============================================================
name               value      effect (records at least this long)
=================  =========  ===============================================================
CHUNK_FROM         20,000     smoother: cost/gradient/Hessian in chunks of CHUNK_LENGTH steps,
                              and the banded Newton solver (no state bounds) instead of IPOPT
CHUNK_LENGTH       2,000      steps per smoother chunk
PIECE_FROM         20,000     learner: data terms piece by piece (`PieceLearner`), no T-sized graph
PIECE_LENGTH       20,000     steps per learner piece
LEARN_CHUNK_FROM   50,000     learner over all stages: data laid out chunk-major (dynamics stages)
LEARN_CHUNK        4,096      stages per learner chunk
JOINT_CHUNK        20,000     joint Gauss-Newton step: residual Jacobians in chunks of this many
                              stages (bounds the memory of its buffers)
SELECT_STEPS       20,000     initial states: the EKF's process-noise candidates are scored on
                              at most this many first samples, then one full EKF + RTS pass
BATCHED_MIN_TRAJ.  1          smoother (no state bounds, T < CHUNK_FROM): batch the trajectories
                              of a length when there are at least this many of them (1: the
                              choice never depends on how trajectories are sharded)
BATCH_COLUMNS      20,000     time steps (trajectories x T) in one batched Newton solve (memory)
CALL_COLUMNS       2,000      time steps (trajectories x T) in one call of the batched smoother's
                              mapped stage programs (a batch makes several calls): building a
                              mapped Function costs time in proportion to its columns, and larger
                              calls were not faster per step
WARM_FROM          100,000    CE-EM: first fit the leading WARM_LENGTH samples of every trajectory,
                              then the whole record from that theta (`CEEMOptions.warm_start`)
WARM_LENGTH        20,000     samples per trajectory of that warm-start fit
INIT_SAMPLES       100,000    `bla_initialise`: N4SID and the splits' least squares use at most
                              this many leading samples per trajectory
REFINE_SAMPLES     20,000     `bla_initialise(refine=True)`: the output-error polish's samples
SEARCH_SAMPLES     20,000     structure search (`identify(search=...)`): candidates are fitted on at
                              most this many leading samples per trajectory, the chosen one on all
=================  =========  ===============================================================
"""
from __future__ import annotations

CHUNK_FROM = 20_000
CHUNK_LENGTH = 2_000
PIECE_FROM = 20_000
PIECE_LENGTH = 20_000
LEARN_CHUNK_FROM = 50_000
LEARN_CHUNK = 4096
JOINT_CHUNK = 20_000
SELECT_STEPS = 20_000
# batched smoothing of many short trajectories (smoothing/_batched.py). 1: the choice never depends
# on how the trajectories are grouped (with 2, a Dask shard's single trajectory went to IPOPT and
# the sharded fit differed from the sequential one by 1.3e-10 in theta); docs/performance.md
BATCHED_MIN_TRAJECTORIES = 1
BATCH_COLUMNS = 20_000
# helicopter size (T = 500, 2,246-parameter head), per trajectory: 4.7-5.1 ms at 1-40 trajectories
# per call, but 1.8 s to build the 40-trajectory Function, in every fresh worker process
CALL_COLUMNS = 2_000
# long records (issue 24, item 3): the iterations far from the optimum on a leading part, where each
# costs T / WARM_LENGTH times less; the whole record then needs few (docs/long_records.md)
WARM_FROM = 100_000
WARM_LENGTH = 20_000
# the initialiser's least squares on at most this many leading samples (N4SID's LQ grows with T)
INIT_SAMPLES = 100_000
REFINE_SAMPLES = 20_000
SEARCH_SAMPLES = 20_000

FROM_POLICY = -1  # a function argument whose default is "the policy's value" (read at call time)

THRESHOLDS = ("CHUNK_FROM", "PIECE_FROM", "LEARN_CHUNK_FROM", "JOINT_CHUNK", "SELECT_STEPS")
