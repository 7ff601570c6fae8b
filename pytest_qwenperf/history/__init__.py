"""Memory and diagnosis: change points in the history store's series, and the bisection of releases."""
