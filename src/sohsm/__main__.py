"""`python -m sohsm` is the same as the `sohsm` command."""
from sohsm.cli.main import run

run()
