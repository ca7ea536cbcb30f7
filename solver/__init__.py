"""The solvers: the ILP (cvxpy), its peers and the portfolio that runs them (`monet.solver.solve`)."""

# A solve stops once its schedule is proven within this fraction of the bound (the solver's target
# is a schedule within 1 % of the best known one, `solver.best_known`).  Here, not in
# `solver.solve`, so that the CLI's --help can show it without importing cvxpy.
DEFAULT_GAP = 0.01
