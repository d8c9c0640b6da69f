"""Run in a subprocess by tests/test_model_cache.py (a CasADi crash must not kill pytest).

``python tests/_threads_one_model.py N REPEATS WHAT``: N threads run WHAT (comma-separated among
``x0``, ``lm``, ``ipopt``, ``ceem``) REPEATS times each on ONE model object, after the same calls
sequentially on a fresh cache; prints a JSON line with the largest difference from the sequential
results (``max_diff``, NaN if a result is missing) and the errors raised in the threads.
"""
import json
import sys
import threading

import numpy as np

import ceem_casadi as cc
from models import lorenz


def _calls(model, data, what):
    theta0 = lorenz.perturbed(lorenz.TRUE, 0.02, seed=5)
    table = {
        "x0": lambda: cc.estimate_initial_state(model, data, lorenz.TRUE),
        "lm": lambda: cc.refine_output_error(model, data, theta0, options=cc.OutputErrorOptions(max_iters=8)).x0,
        "ipopt": lambda: cc.refine_output_error(model, data, theta0,
                                                options=cc.OutputErrorOptions(solver="ipopt", max_iters=8)).x0,
        "ceem": lambda: model.theta_vector(cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=3)).theta),
    }
    return [(name, table[name]) for name in what]


def main(n_threads: int, repeats: int, what: list[str]) -> dict:
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=3), 40, measurement_std=0.01, seed=0)
    calls = _calls(model, data, what)
    sequential = {name: np.asarray(fun(), float) for name, fun in calls}
    cc.runtime.clear_model_cache()  # the threads build everything again, concurrently
    results, errors = [], []
    barrier = threading.Barrier(n_threads)

    def work(i):
        try:
            barrier.wait()
            for r in range(repeats):
                for name, fun in calls[(i + r) % len(calls):] + calls[:(i + r) % len(calls)]:
                    results.append((name, np.asarray(fun(), float)))
        except Exception as exc:  # reported, compared by the test
            errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    diffs = [float(np.max(np.abs(val - sequential[name]))) for name, val in results]
    complete = len(results) == n_threads * repeats * len(calls)
    return {"max_diff": max(diffs) if diffs and complete else float("nan"), "results": len(results),
            "errors": errors}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(","))))
