from slipway.cli import run

run()
