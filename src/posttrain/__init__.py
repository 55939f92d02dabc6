"""posttrain: LLM post-training that researchers can trust and actually run."""

__version__ = "0.1.0"
