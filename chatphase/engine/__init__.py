"""Inference core. Nothing in this package imports Textual."""
