"""Figures of a fit (history, states, predictions, parameter intervals, residuals, bands), PNG or SVG from the
file suffix, drawn with matplotlib's Agg backend; each function returns the path written (or the Figure)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .runtime._atomic import atomic_path

SUFFIXES = (".png", ".svg")
MAX_LINES = 12   # entries drawn per matrix/vector parameter


def _figure(rows: int, cols: int = 1, height: float = 2.0):
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt.subplots(rows, cols, figsize=(8, max(2.5, height * rows)), squeeze=False)


def _time(T: int, dt: float | None):
    """Time axis (T,) in seconds when ``dt`` else in samples, and its label."""
    return np.arange(T) * (dt or 1.0), "time [s]" if dt else "sample"


def _legend(ax, xlabel: str | None = None) -> None:
    ax.legend(loc="upper right", fontsize="small")
    if xlabel is not None:
        ax.set_xlabel(xlabel)


def _save(fig, path):
    """Write ``fig`` to ``path`` (atomically) and return the path; the Figure itself when ``path`` is None."""
    import matplotlib.pyplot as plt

    plain_text(fig)
    fig.tight_layout()
    if path is None:
        return fig
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        plt.close(fig)
        raise ValueError(f"figure file must end in {' or '.join(SUFFIXES)}, got {path.name!r}")
    try:
        with atomic_path(path) as tmp:  # never through a symlink; creates the folder
            fig.savefig(tmp, dpi=120, format=path.suffix[1:].lower())
    finally:
        plt.close(fig)
    return path


MAX_TITLE_CHARS = 120  # a title is cut to this (texts from files may be long)


def plain_text(fig) -> None:
    """Draw every text of ``fig`` as written: no mathtext (names and titles come from files; a
    ``$`` in them must neither raise nor start a math parser that can run for minutes)."""
    from matplotlib.text import Text

    for t in fig.findobj(Text):
        t.set_parse_math(False)


def short_title(title: str) -> str:
    """``title`` cut to ``MAX_TITLE_CHARS`` characters on one line."""
    title = " ".join(str(title).split())
    return title if len(title) <= MAX_TITLE_CHARS else title[:MAX_TITLE_CHARS - 3] + "..."


def _get(rec, key):
    return rec[key] if isinstance(rec, dict) else getattr(rec, key)


def plot_history(history, path, *, truth: dict | None = None, title: str = "") -> Path:
    """Objective J and every parameter vs EM iteration (records or dicts; at most
    ``MAX_LINES`` entries per array parameter). ``truth`` (dict) is drawn as dashed lines."""
    if not history:
        raise ValueError("the history is empty: nothing to plot")
    it = np.array([_get(r, "iteration") for r in history])
    thetas = [_get(r, "theta") for r in history]
    names = list(thetas[0])
    fig, axes = _figure(1 + len(names))
    ax = axes[0, 0]
    J = np.array([_get(r, "J") for r in history], float)
    ax.plot(it, J, "o-", label="J (joint log-density)")
    ax.set_xlabel("EM iteration")
    ax.set_ylabel("J")
    gap = np.nanmax(J) - J
    if np.sum(gap > 0) > 1:   # distance to the best J on a log axis shows the convergence rate
        tw = ax.twinx()
        keep = gap > 0
        tw.semilogy(it[keep], gap[keep], "s--", color="C1", ms=3, label="max J - J")
        tw.set_ylabel("max J - J")
        handles = ax.get_legend_handles_labels()[0] + tw.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="center right", fontsize="small")
    else:
        ax.legend(loc="lower right")
    if title:
        ax.set_title(short_title(title))
    for ax, name in zip(axes[1:, 0], names):
        vals = np.array([np.ravel(np.asarray(t[name], float)) for t in thetas])
        for j in range(min(vals.shape[1], MAX_LINES)):
            line, = ax.plot(it, vals[:, j], ".-", label=name if vals.shape[1] == 1 else f"{name}[{j}]")
            if truth is not None and name in truth:
                ax.axhline(np.ravel(truth[name])[j], ls="--", color=line.get_color(), lw=0.8,
                           label="truth" if j == 0 else None)
        ax.set_xlabel("EM iteration")
        ax.set_ylabel(name)
        ax.legend(loc="best", fontsize="small", ncol=2)
    return _save(fig, path)


def plot_states(x, y, path, *, y_fit=None, dt: float | None = None, state_names=None, output_names=None) -> Path:
    """Smoothed states ``x`` (T, nx) and observed outputs ``y`` (T, ny; NaN = missing) with the
    model outputs ``y_fit`` (T, ny) of the smoothed states. Time axis in seconds when ``dt``."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    (T, nx), ny = x.shape, y.shape[1]
    t, xlabel = _time(T, dt)
    sn = state_names or [f"x{i}" for i in range(nx)]
    on = output_names or [f"y{j}" for j in range(ny)]
    fig, axes = _figure(nx + ny, height=1.6)
    for i, ax in enumerate(axes[:nx, 0]):
        ax.plot(t, x[:, i], "-", label=f"smoothed {sn[i]}")
        ax.set_ylabel(sn[i])
    for j, ax in enumerate(axes[nx:, 0]):
        ax.plot(t, y[:, j], ".", ms=3, label=f"observed {on[j]}")
        if y_fit is not None:
            ax.plot(t, np.asarray(y_fit)[:, j], "-", lw=1, label="g(smoothed x)")
        ax.set_ylabel(on[j])
    for ax in axes[:, 0]:
        _legend(ax, xlabel)
    return _save(fig, path)


def plot_prediction(y, y_pred, path, *, dt: float | None = None, output_names=None, label: str = "prediction") -> Path:
    """Measured ``y`` vs predicted ``y_pred`` (T, ny) per output, and the error ``y - y_pred``."""
    y, y_pred = np.asarray(y, float), np.asarray(y_pred, float)
    ny = y.shape[1]
    t, xlabel = _time(y.shape[0], dt)
    on = output_names or [f"y{j}" for j in range(ny)]
    fig, axes = _figure(2 * ny, height=1.6)
    for j in range(ny):
        ax, ax_err = axes[2 * j, 0], axes[2 * j + 1, 0]
        ax.plot(t, y[:, j], ".", ms=3, label="measured")
        ax.plot(t, y_pred[:, j], "-", lw=1, label=label)
        ax.set_ylabel(on[j])
        err = y[:, j] - y_pred[:, j]
        ok = np.isfinite(err)
        rmse = float(np.sqrt(np.mean(err[ok] ** 2))) if ok.any() else float("nan")
        ax_err.plot(t, err, "-", lw=1, color="C3", label=f"error (RMSE {rmse:.3g})")
        ax_err.axhline(0.0, color="k", lw=0.5)
        ax_err.set_ylabel(f"{on[j]} error")
    for ax in axes[:, 0]:
        _legend(ax, xlabel)
    return _save(fig, path)


def plot_parameter_intervals(uncertainty, path, *, truth: dict | None = None, max_entries: int = 40,
                             title: str = "") -> Path:
    """Estimates and intervals of a [`ParameterUncertainty`][ceem_casadi.workflow.ParameterUncertainty] (or its
    ``to_dict()``), one row per free entry (at most ``max_entries``), on the relative axis ``100 (value - estimate) /
    |estimate|`` [%]; ``truth`` (theta dict) adds the true values."""
    u = uncertainty.to_dict() if hasattr(uncertainty, "to_dict") else uncertainty
    names = list(u["names"])[:max_entries]
    if not names:
        raise ValueError("no free parameters: nothing to plot")
    n = len(names)
    est, lo, hi = (np.asarray(u[k], float)[:n] for k in ("estimate", "lower", "upper"))
    scale = np.where(est != 0, np.abs(est), 1.0) / 100.0
    fig, axes = _figure(1, height=max(2.5, 0.28 * n))
    ax = axes[0, 0]
    yy = np.arange(n)[::-1]
    ok = np.isfinite(lo) & np.isfinite(hi)
    ax.errorbar(np.zeros(ok.sum()), yy[ok], xerr=[(est - lo)[ok] / scale[ok], (hi - est)[ok] / scale[ok]],
                fmt="o", capsize=3, label=f"estimate, {100 * u.get('level', 0.95):g} % interval")
    half = np.abs(((hi - est) / scale)[ok])
    span = 1.3 * (float(half.max()) if half.size and half.max() > 0 else 1.0)
    wide = np.isinf(hi) | np.isinf(lo)
    if wide.any():
        ax.barh(yy[wide], 2 * span, left=-span, height=0.3, color="C3", alpha=0.5, label="not identifiable")
    bound = np.isnan(hi) & ~wide
    if bound.any():
        ax.plot(np.zeros(bound.sum()), yy[bound], "D", color="0.5", label="at a bound (no interval)")
    if truth is not None:
        tv = []
        for name in names:
            base, _, idx = name.partition("[")
            val = np.asarray(truth[base], float)
            tv.append(val[tuple(int(i) for i in idx.rstrip("]").split(","))] if idx else float(val))
        ax.plot((np.array(tv) - est) / scale, yy, "x", color="k", label="truth")
    ax.set_yticks(yy, names)
    ax.axvline(0.0, color="k", lw=0.5)
    ax.set_xlim(-span, span)
    ax.set_xlabel("100 (value - estimate) / |estimate|  [%]")
    ax.legend(loc="best", fontsize="small")
    if title:
        ax.set_title(short_title(title))
    return _save(fig, path)


def plot_residuals(analysis, path=None, *, kind: str = "one_step", dt: float | None = None):
    """MATLAB ``resid``'s figure for one kind of residual of a
    [`ResidualAnalysis`][ceem_casadi.workflow.ResidualAnalysis] (autocorrelation, cross-correlation with each
    input, bounds shaded), saved to ``path``, else the Figure."""
    c = analysis.kinds[kind]
    ny, nu, L = len(analysis.output_names), len(analysis.input_names), analysis.lags
    fig, axes = _figure(1 + nu, ny, height=2.2)
    scale, unit = (dt, "s") if dt else (1.0, "samples")
    pos, both = np.arange(L + 1) * scale, np.arange(-L, L + 1) * scale
    for j, yname in enumerate(analysis.output_names):
        ax = axes[0, j]
        ax.vlines(pos, 0.0, c.autocorr[j], color="C0")
        ax.plot(pos, c.autocorr[j], "o", ms=3, color="C0")
        ax.axhspan(-c.auto_bound[j], c.auto_bound[j], color="C0", alpha=0.15)
        ax.set_title(f"{kind}: autocorrelation of e({yname}), Ljung-Box p = {c.p_value[j]:.3g}", fontsize="small")
        for i, uname in enumerate(analysis.input_names):
            ax = axes[1 + i, j]
            ax.vlines(both, 0.0, c.crosscorr[j, i], color="C1")
            ax.plot(both, c.crosscorr[j, i], "o", ms=3, color="C1")
            if np.isfinite(c.cross_bound[j, i]):
                ax.axhspan(-c.cross_bound[j, i], c.cross_bound[j, i], color="C1", alpha=0.15)
            ax.set_title(f"cross-correlation of e({yname}) and {uname}", fontsize="small")
        for ax in axes[:, j]:
            ax.axhline(0.0, color="k", lw=0.5)
        axes[-1, j].set_xlabel(f"lag [{unit}]")
    return _save(fig, path)


def plot_band(y, y_hat, lower, upper, path=None, *, dt: float | None = None, output_names=None,
              label: str = "prediction", skip: int = 0):
    """Measured ``y``, prediction ``y_hat`` and its band ``[lower, upper]`` (each (T, ny)) per output; the first
    ``skip`` samples (used to estimate the initial state) shaded grey. Saves to ``path`` and returns it, or
    returns the Figure when ``path`` is None."""
    y, y_hat = np.asarray(y, float), np.asarray(y_hat, float)
    T, ny = y.shape
    t, xlabel = _time(T, dt)
    on = output_names or [f"y{j}" for j in range(ny)]
    fig, axes = _figure(ny, height=2.4)
    for j, ax in enumerate(axes[:, 0]):
        ax.fill_between(t, lower[:, j], upper[:, j], color="C1", alpha=0.3, lw=0, label="band")
        ax.plot(t, y[:, j], ".", ms=3, color="0.4", label="measured")
        ax.plot(t, y_hat[:, j], "-", lw=1, color="C1", label=label)
        if skip:
            ax.axvspan(t[0], t[min(skip, T - 1)], color="0.9", zorder=0)
        ax.set_ylabel(on[j])
        _legend(ax)
    axes[-1, 0].set_xlabel(xlabel)
    return _save(fig, path)
