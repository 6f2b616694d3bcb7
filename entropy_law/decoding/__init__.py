"""Decoding layer (torch): target loading, lossless speculative decoding, drafters, recording hooks.

Never imports ``entropy_law.law``; it talks to the analysis only through trace files.
"""
