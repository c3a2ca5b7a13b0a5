"""Engines: where the gateway's tokens come from."""
