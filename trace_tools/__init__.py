"""trace-tools: offline trace replay and analysis for agent-RL rollout gateways."""
__version__ = "0.1.0"
