"""Runtime half: imported inside every rank (torch and lightning are loaded here, never by the CLI)."""
