"""pytest glue only: options, ini keys, markers, fixtures and hooks over the library."""
