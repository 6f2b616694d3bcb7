"""The trace format (v1): schema, writer (``TraceRecorder``) and reader (``load_traces``).

Depends on numpy and pyarrow only; never imports torch, so any engine can log through it.
"""
