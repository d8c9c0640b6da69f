import time, numpy as np, ceem_casadi as cc
from ceem_casadi.initialise import eks_states
from ceem_casadi import banded_newton as bn
from scripts.bench_lorenz import make_problem
LOG = []
orig = bn.BandedNewton.steps
def steps(self, x0):
    gen = orig(self, x0); rec = []; LOG.append(rec)
    req = next(gen)
    try:
        while True:
            ans = yield req
            if req[0] == bn.NEWTON:
                f, g = ans[0], ans[1]
                rec.append((f, float(np.max(np.abs(g)))))
            req = gen.send(ans)
    except StopIteration as s:
        rec.append(s.value.status)
        return s.value
bn.BandedNewton.steps = steps
model, data, truth, theta0 = make_problem("coupled8", 0)
x_init = eks_states(model, model.theta_vector(theta0), data)
for s in ("batched", "ipopt"):
  opts = cc.CEEMOptions(max_iters=200, acceleration="newton", n_jobs=2, smoother=cc.SmootherOptions(solver=s))
  t = time.perf_counter()
  r = cc.ceem(model, data, theta0, options=opts, x_init=x_init)
  print(s, "%.2f" % (time.perf_counter() - t), r.iterations, r.J, [(h.kind, round(h.smooth_s, 2), sorted(set(h.smooth_status))) for h in r.history if h.kind == "em"])
