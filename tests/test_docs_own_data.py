"""docs/own_data.md cannot silently rot: its commands (the ```bash blocks, then the ```python block),
extracted from the page by scripts/own_data_tutorial.py, run in order on 200 simulated samples of the
tanks model in a temporary folder (3 CE-EM iterations, two noise levels), every CLI command with exit
code 0 or 1 (1 = not converged, files written), the files the tutorial names written, and the refined
model simulating the test split far better than the data's own spread."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from ceem_casadi.deploy._codegen import compiler
from scripts.own_data_tutorial import CLI, doc_blocks, run_tutorial, shell_commands, simulated_tanks_csv


def test_doc_sequence_is_the_expected_workflow():
    """The page shows the workflow of issue 14 item 8, in this order, and a Python equivalent."""
    cmds = [c for lang, code in doc_blocks() if lang == "bash" for c in shell_commands(code)]
    steps = [c.split()[1] for c in cmds if c.startswith(CLI)]
    assert steps == ["fit", "evaluate", "calibrate-noise", "refine", "evaluate", "evaluate", "plot", "codegen"]
    assert all("--x0-window 5" in c for c in cmds if c.split()[1:2] == ["evaluate"])     # benchmark protocol
    python = [code for lang, code in doc_blocks() if lang == "python"]
    assert len(python) == 1 and all(f in python[0] for f in ("cc.ceem(", "cc.calibrate_noise(",
                                                              "cc.refine_output_error(", "cc.validation_report(",
                                                              "cc.generate_ekf("))


def test_tutorial_runs_on_simulated_tanks(tmp_path):
    data = simulated_tanks_csv(tmp_path / "tanks_sim.csv", n=200)
    log = run_tutorial(tmp_path, str(data), smoke=True, echo=False, in_process=True)
    for rec in log:
        ok = (0, 1) if rec["command"].startswith(CLI) else (0,)
        assert rec["rc"] in ok, (rec["command"], rec["stderr"][-2000:])
    for name in ("fit.npz", "calibrated.npz", "refined.npz", "noise.csv", "noise.png", "test_report.json",
                 "figures/simulation.png", "figures/prediction.png", "refined_py.npz"):
        assert (tmp_path / "tanks" / name).is_file(), name
    if compiler() is not None:
        assert (tmp_path / "tanks" / "c" / "tanks").is_file()
    report = json.loads((tmp_path / "tanks" / "test_report.json").read_text())
    y_val = pd.read_csv(data)["yVal"].to_numpy()[5:]
    assert report["skip"] == 5
    assert report["simulation"]["overall"]["rmse"] < 0.5 * np.std(y_val)
