"""N4SID (linear subspace identification), the baseline CE-EM is compared with that the library also uses (the
BLA initialiser). The EKF and the Kalman filter are in `ceem_casadi.filtering`; the measured-dominated comparison
baselines (particle methods, LSTM) are in the repository's ``scripts/baselines/`` (docs/baselines.md)."""
from ._n4sid import N4SIDResult, n4sid

__all__ = ["N4SIDResult", "n4sid"]

_MOVED = dict.fromkeys(("particle_filter", "ffbsi", "particle_em", "ParticleEMOptions", "ParticleEMRecord",
                        "ParticleEMResult", "ParticleFilterResult"),
                       "particle EM was 22.9-26.9x slower per epoch than CE-EM with a larger parameter error "
                       "(0.0103 vs 0.0077) on Lorenz, and poor on six coupled Lorenz")
_MOVED.update(dict.fromkeys(("LSTM", "sequence_loss_factory", "windows"),
                            "the LSTM's test RMSE on the helicopter was 13.6 vs CE-EM's 0.747 (stand-in) and "
                            "1.30 vs 0.615 (published, real data)"))


def __getattr__(name: str):
    """A removed name raises an ImportError (also for ``from ceem_casadi.baselines import name``) that says
    where it went and why."""
    if name in _MOVED:
        raise ImportError(f"ceem_casadi.baselines.{name} was removed from the library: it is now "
                          f"scripts.baselines.{name} in the repository (run from its root), because the library never "
                          f"used it and {_MOVED[name]} (docs/baselines.md)", name=name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
