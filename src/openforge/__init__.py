"""openforge: train harness-native AI agents with reinforcement learning."""

__version__ = "0.1.1"
