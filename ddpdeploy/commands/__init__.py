"""One module per CLI command; `ddpdeploy.cli.COMMANDS` registers them."""
