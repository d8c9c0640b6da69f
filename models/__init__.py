"""Gray-box model definitions (factories returning ceem_casadi.StateSpaceModel)."""
