"""Artifact bytes: the frame, one codec per module kind, the CUDA payload; nothing here pickles."""
