"""Deployment: integrity-checked model files, the C code of EKF predictors, and the identified
model exported as plain CasADi Functions for optimal control (and as a do-mpc model)."""
from ..model._export import ExportResult, export_casadi
from ._codegen import GeneratedEKF, generate_ekf
from ._do_mpc import to_do_mpc
from ._modelfile import ModelFileError, SavedModel, load_model, save_model

__all__ = ["ExportResult", "GeneratedEKF", "export_casadi", "ModelFileError", "SavedModel", "generate_ekf",
           "load_model", "save_model", "to_do_mpc"]
