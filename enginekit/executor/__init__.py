"""Executors turn a SchedulerOutput into sampled tokens and a step time."""
