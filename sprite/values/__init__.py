"""The value grammar below spec and schedulers: integers, switches, env names, scheduler tokens."""
