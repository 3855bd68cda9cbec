"""The answers a sweep gives, computed from its cells: frontiers, gains, recommendations.

Pure: pandas/numpy in, typed results out; no server, no files.
"""
