"""The layout of single- and multiple-shooting output-error problems, shared by the IPOPT problem
and the Levenberg-Marquardt engine: the segments of every trajectory and the groups of segments
simulated by one mapped rollout."""
from __future__ import annotations

from dataclasses import dataclass

import casadi as ca


def segments(lengths, shooting) -> list[tuple[int, int, int, bool]]:
    """``(trajectory, start, samples, has_next)`` per shooting segment: k samples from every node, the
    last one shorter (``shooting=None``: one segment per trajectory)."""
    out = []
    for b, T in enumerate(lengths):
        k = T if shooting is None else int(shooting)
        for s0 in range(0, T, k):
            n = min(k, T - s0)
            out.append((b, s0, n, s0 + n < T))
    return out


@dataclass(frozen=True)
class ShootingLayout:
    """Segments (`segments`) and ``groups``: (samples simulated, segment indices) per mapped rollout (a segment with
    a successor simulates one sample more, to predict the next node); ``n_u`` input columns, ``n_obs`` samples."""

    segs: list
    groups: list
    n_u: int
    n_obs: int

    @classmethod
    def of(cls, lengths, shooting) -> ShootingLayout:
        """The layout of trajectories of ``lengths`` with segments of ``shooting`` samples (None: single)."""
        segs = segments(lengths, shooting)
        grouped: dict[int, list[int]] = {}
        for i, (_, _, n, nxt) in enumerate(segs):
            grouped.setdefault(n + int(nxt), []).append(i)
        groups = sorted(grouped.items())
        return cls(segs, groups, sum(L * len(idx) for L, idx in groups), sum(n for _, _, n, _ in segs))

    def free_runs(self, rollout, nodes, U, p):
        """Symbolic free runs of every segment from its ``nodes`` (nx, n_nodes) with the inputs ``U`` (nu, n_u)
        and parameters ``p`` (``rollout(L)``: the model's rollout Function over L samples): the outputs
        (ny, n_obs) and the continuity gaps (nx * n_gaps, 1) of the segments with a successor."""
        yhat, gaps, u_col = [], [], 0
        for L, idx in self.groups:
            Yh, Xh = rollout(L).map(len(idx))(nodes[:, idx], U[:, u_col:u_col + L * len(idx)], p)
            u_col += L * len(idx)
            for j, i in enumerate(idx):
                _, _, n, nxt = self.segs[i]
                yhat.append(Yh[:, j * L:j * L + n])
                if nxt:
                    gaps.append(Xh[:, j * L + n] - nodes[:, i + 1])
        return ca.horzcat(*yhat), (ca.vertcat(*gaps) if gaps else ca.MX(0, 1))
