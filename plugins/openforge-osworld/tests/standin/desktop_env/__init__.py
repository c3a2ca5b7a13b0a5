"""Stand-in `desktop_env` package: see desktop_env.py."""
