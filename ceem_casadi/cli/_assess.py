"""``evaluate --residuals --bands [--plot DIR]``: the residual analysis and the simulation bands of the evaluated
model, printed as tables, returned for the JSON report, and drawn with ``--plot``."""
from __future__ import annotations

from pathlib import Path

from ..errors import CeemError
from ._inputs import UsageError


def assess(args, model, data, theta_vec, x0, skip: int, ks, uncertainty) -> dict:
    """Run what ``--residuals`` and ``--bands`` ask for; returns ``{"residuals": ..., "bands": ...}`` (JSON-ready)."""
    residuals, bands, plot_dir = args.residuals, args.bands, args.plot
    if plot_dir and not (residuals or bands):
        raise UsageError("--plot draws the figures of --residuals and --bands: give one of them")
    if bands and uncertainty is None:
        raise UsageError("--bands needs the parameter covariance: a model file written with uncertainty, or "
                         "--uncertainty exact|gauss-newton")
    out = {}
    figures = Path(plot_dir) if plot_dir else None
    if figures is not None:
        figures.mkdir(parents=True, exist_ok=True)
    try:
        if residuals:
            from ..workflow.assessment._residuals import residual_analysis

            lags = min(25, min(data.lengths) - skip - 1)
            res = residual_analysis(model, data, theta_vec, x0=x0, skip=skip, lags=lags)
            print(f"residual analysis ({lags} lags, {100 * res.level:g} % bounds; white: Ljung-Box p >= "
                  f"{1 - res.level:g}; independent: every input cross-correlation inside its bound):")
            print(res.table())
            out["residuals"] = res.to_dict()
            if figures is not None:
                for kind in res.kinds:
                    print(f"wrote {res.plot(figures / f'residuals_{kind}.png', kind=kind, dt=model.dt)}")
        if bands:
            from ..workflow.assessment._bands import simulation_bands

            bd = simulation_bands(model, data, theta_vec, uncertainty, x0=x0, skip=skip, k=list(ks) or None,
                                  measurement_noise=True)
            print(f"bands for new measurements ({100 * bd.level:g} %: the parameter covariance propagated to first "
                  "order, plus the measurement noise; measured_inside should be near the level):")
            print(bd.table())
            out["bands"] = bd.to_dict()
            if figures is not None:
                for b in range(len(data)):
                    print(f"wrote {bd.plot(figures / f'band_simulation_{b}.png', trajectory=b, dt=model.dt)}")
    except CeemError as exc:
        raise UsageError(str(exc)) from None
    return out
