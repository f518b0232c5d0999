"""Package data: launch_templates/ (installed as sprite.launch_templates)."""
