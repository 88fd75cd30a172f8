"""Speculative decoding, engine-neutral: types, drafters, sampling, planner and the loop."""
