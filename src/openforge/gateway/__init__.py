"""The recording gateway: serves harnesses' model calls from the policy and records them."""
