"""Typed, validated configuration files shared by the research-side tools."""

from research.configs.loading import ConfigError, StrictModel, load_yaml_model, parse_model

__all__ = ["ConfigError", "StrictModel", "load_yaml_model", "parse_model"]
