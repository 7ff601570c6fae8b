"""The ``qwenperf`` command: a thin dispatcher and one module per subcommand."""
