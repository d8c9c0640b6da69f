#!/usr/bin/env bash
# Mutation testing of the core modules with mutmut (>= 3.8), kept out of CI (minutes per module).
#
#   scripts/mutation_check.sh                      # every module below
#   scripts/mutation_check.sh smoother ceem        # some of them
#
# Each module runs in its own scratch copy of the repository ($MUTATION_DIR, default
# /tmp/ceem_mutation/<module>) with a [tool.mutmut] section selecting that module and its FAST
# tests only (mutmut runs, for every mutant, the selected tests that call the mutated function).
# Niced ($MUTATION_NICE, default 15), one worker by default ($MUTATION_JOBS), bounded by $MUTATION_TIMEOUT seconds per module.
# MUTATION_TESTS='"tests/a.py", "tests/b.py::test_c"' replaces the module's test selection.
# MUTATION_RESUME=1 continues an interrupted run in the same scratch copy (same tests).
# Results: `mutmut results` inside the scratch copy; a summary line per module is printed and
# appended to $MUTATION_DIR/summary.txt. Record survivors and the reasons in docs/testing.md.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BASE="${MUTATION_DIR:-/tmp/ceem_mutation}"
JOBS="${MUTATION_JOBS:-1}"
LIMIT="${MUTATION_TIMEOUT:-3600}"
NICE="${MUTATION_NICE:-15}"
# statements starting on lines matching this regex are not mutated: logging calls (their text
# and level change no result; set MUTATION_SKIP= to mutate them too)
SKIP="${MUTATION_SKIP-^\s*log\.(debug|info|warning|error)\(|ca\.(MX|SX)\.sym\(\"}"

declare -A FILE TESTS
FILE[stages]=ceem_casadi/objective/_stages.py
TESTS[stages]='"tests/test_core_stages.py", "tests/test_core_smoother.py", "tests/test_core_learner.py", "tests/test_joint.py::test_joint_step_equals_dense_levenberg_marquardt_solve", "tests/test_uncertainty.py::test_reduced_hessian_equals_dense_schur_complement", "tests/test_core_ceem.py::test_learner_recovers_lorenz_parameters_from_true_states"'
FILE[smoother]=ceem_casadi/smoothing/_smoother.py
TESTS[smoother]='"tests/test_core_smoother.py", "tests/test_core_ceem_loop.py"'
FILE[learner]=ceem_casadi/learning/_learner.py
TESTS[learner]='"tests/test_core_learner.py", "tests/test_core_ceem.py::test_learner_recovers_lorenz_parameters_from_true_states", "tests/test_core_ceem.py::test_learner_respects_bounds_fixed_entries_and_prior", "tests/test_uncertainty.py::test_learning_hessian_exact_equals_gauss_newton_at_zero_residuals"'
FILE[ceem]=ceem_casadi/em/_ceem.py
TESTS[ceem]='"tests/test_core_ceem_loop.py", "tests/test_status_time_limit.py", "tests/test_core_ceem.py::test_ceem_parallel_smoothing_matches_sequential", "tests/test_core_errors.py"'
FILE[joint]=ceem_casadi/em/_joint_gauss_newton.py
TESTS[joint]='"tests/test_joint.py::test_joint_step_equals_dense_levenberg_marquardt_solve", "tests/test_joint.py::test_joint_step_with_observed_parameters_priors_and_bounds_equals_dense_solve", "tests/test_joint.py::test_joint_step_without_free_parameters_is_a_damped_state_step", "tests/test_core_ceem_loop.py::test_newton_damping_falls_after_accepted_steps_and_rises_after_a_failed_solve", "tests/test_core_ceem_loop.py::test_acceleration_steps_are_taken_and_change_the_iterates"'
FILE[ekf]=ceem_casadi/filtering/_ekf.py
TESTS[ekf]='"tests/test_baselines_kalman_ekf.py"'

modules=("$@")
[ ${#modules[@]} -eq 0 ] && modules=(smoother stages ceem learner joint ekf)
mkdir -p "$BASE"
for m in "${modules[@]}"; do
    [ -n "${FILE[$m]:-}" ] || { echo "unknown module $m (one of ${!FILE[*]})" >&2; exit 2; }
    dir="$BASE/$m"
    if [ -n "${MUTATION_RESUME:-}" ] && [ -d "$dir/mutants" ]; then
        echo "== resuming $m: mutants already checked keep their result"
    else
        rm -rf "$dir" && mkdir -p "$dir"
        cp -r "$ROOT/ceem_casadi" "$ROOT/models" "$ROOT/scripts" "$ROOT/tests" "$dir/"
    fi
    # the repository's pyproject.toml without its [tool.mutmut] section, plus this module's section
    python - "$ROOT/pyproject.toml" "$dir/pyproject.toml" "${FILE[$m]}" "${MUTATION_TESTS:-${TESTS[$m]}}" "$SKIP" <<'PY'
import json, re, sys
src, dst, path, tests, skip = sys.argv[1:]
text = re.sub(r"(?ms)^\[tool\.mutmut\].*?(?=^\[|\Z)", "", open(src).read())
text += f"""
[tool.mutmut]
source_paths = ["ceem_casadi"]
only_mutate = ["{path}"]
also_copy = ["models", "scripts"]
pytest_add_cli_args = ["-p", "no:cacheprovider", "-x", "-q"]
pytest_add_cli_args_test_selection = [{tests}]
timeout_multiplier = 5.0
timeout_constant = 10.0
do_not_mutate_patterns = {json.dumps([skip] if skip else [])}
"""
open(dst, "w").write(text)
PY
    echo "== $m (${FILE[$m]}) in $dir"
    # MUTATION_ONLY="name1 name2 ...": only these mutants (globs allowed), e.g. the survivors of an
    # earlier run re-checked against new tests (names are stable while the module is unchanged)
    # shellcheck disable=SC2086
    (cd "$dir" && MPLBACKEND=Agg timeout "$LIMIT" nice -n "$NICE" mutmut run --max-children "$JOBS" ${MUTATION_ONLY:-} \
        > run.log 2>&1) || \
        echo "   mutmut exited with $? (timeout = 124); see $dir/run.log"
    (cd "$dir" && mutmut results --all true > results.txt 2>&1 || true)
    summary="$m: $(grep -c ': killed' "$dir/results.txt" || true) killed, $(grep -c ': survived' "$dir/results.txt" || true) survived, $(grep -c ': timeout' "$dir/results.txt" || true) timeout, $(grep -c ': no tests' "$dir/results.txt" || true) no tests, $(grep -c ': not checked' "$dir/results.txt" || true) not checked"
    echo "   $summary"
    echo "$summary" >> "$BASE/summary.txt"
done
