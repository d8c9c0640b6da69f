"""The learning terms of a piece (`ceem_casadi.learning._terms.terms_of`) with a numpy NLP parameter
are evaluated through CasADi's buffers (no DM conversion: 8.5 of 21 s of a learning step at
T = 10^6) and equal the plain call's with a DM parameter bit for bit."""
import casadi as ca
import numpy as np

import ceem_casadi as cc
from ceem_casadi.learning import Learner
from ceem_casadi.learning._terms import terms_of
from ceem_casadi.smoothing._initial_states import eks_states
from models import lorenz


def test_buffered_piece_terms_equal_the_plain_call():
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(1, seed=3), 60, measurement_std=0.05, seed=4)
    theta = model.theta_vector(lorenz.perturbed(lorenz.TRUE, 0.05, seed=5))
    xs = eks_states(model, theta, data)
    learner = Learner(model, data.lengths, cc.LearnerOptions(compile=False))
    P = np.asarray(learner.parameter_vector(theta, data, xs, 0.0), float)
    z = theta[model.params.free_index] * 1.01
    for what in ("f", "grad", "all", "hess"):
        fast = terms_of(learner, P, z, what)[:-1]
        plain = terms_of(learner, ca.DM(P), z, what)[:-1]
        for a, b in zip(fast, plain):
            if a is None:
                assert b is None
                continue
            a, b = (np.asarray(getattr(v, "parts", v)) for v in (a, b))
            np.testing.assert_array_equal(a, b, err_msg=what)
    assert getattr(learner, "_buffered_calls", None), "the numpy parameter did not take the buffered call"
