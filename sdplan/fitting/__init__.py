"""Fitting the latency model to measured runs, and the model's error against them."""
