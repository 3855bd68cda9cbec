"""``avbench predict``: the cells of arms that were not measured, from one that was.

``source`` reads a run's captures, ``curves`` fits the step cost curves (tables built by vLLM's
own ``build_cost_tables_from_curves``), ``vllm_av`` holds vLLM's AV decision code, ``model`` is
the pure predictor, ``validate`` compares predictions with measured cells, ``predicted`` ties them
together for the command (docs/predict.md).
"""
