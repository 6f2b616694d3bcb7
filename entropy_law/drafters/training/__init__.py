"""Training the block drafter on this CPU: greedy target data (``data``) and the losses and loop (``loop``)."""
