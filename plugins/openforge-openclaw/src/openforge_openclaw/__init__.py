"""openforge harness plugin for OpenClaw (`openclaw agent exec`), from npm `openclaw`."""

__version__ = "0.1.0"
