"""openforge harness plugin for ZeroClaw (`zeroclaw agent -m`), a Rust binary."""

__version__ = "0.1.0"
