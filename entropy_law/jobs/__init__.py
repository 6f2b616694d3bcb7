"""Jobs: the main demo, the reference traces and the report, built on decoding, drafters, traces and law."""
