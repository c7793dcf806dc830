"""What a trainer was given: sample dumps written after a trajectory manager (slime/miles rollout
and train data, miles dashboards, prime-rl token exports), read into `TrainerSample` records, and
audited without per-call data (docs/trainer_dumps.md)."""
