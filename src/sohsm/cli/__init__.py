"""The `sohsm` command line: one small module per subcommand, listed in `main.COMMANDS`."""
