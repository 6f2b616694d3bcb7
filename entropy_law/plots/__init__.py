"""Figures: plot functions (data first, keyword-only options, ``ax=None`` -> ``ax``) and one style."""
