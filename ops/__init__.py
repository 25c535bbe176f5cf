"""Ops: the canary rollout controller and deploy assets."""
