"""Deployment: integrity-checked model files and the C code of EKF predictors."""
from ._codegen import GeneratedEKF, generate_ekf
from ._modelfile import ModelFileError, SavedModel, load_model, save_model

__all__ = ["GeneratedEKF", "ModelFileError", "SavedModel", "generate_ekf", "load_model", "save_model"]
