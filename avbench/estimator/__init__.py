"""The estimator laboratory (issue 4): labeled drafts, the online acceptance estimator,
calibration metrics, the lossless check and the study's tables.

Modules: drafts (parquet schema), online (numpy reference of vLLM's estimator + replay),
calibration (AUC, log-loss, ECE, bootstrap), features, lossless, trace (offline drafts with
transformers), live_vs_trace (per-position acceptance, live against a trace; the check of a
run: run.live_check), prompts, tables + published, synthetic (simulated drafts for tests and
bench).
"""
