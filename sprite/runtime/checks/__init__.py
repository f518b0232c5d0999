"""The fit-start checks: what the launched world and the script's data loaders must agree on."""
