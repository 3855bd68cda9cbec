"""Same spec → same conversations in the same order (every arm of a sweep reuses it)."""

from __future__ import annotations

import numpy as np

from avbench.workloads.registry import builtin_workloads, load_workload


def _spec(name="gsm8k", **update):
    return builtin_workloads()[name].model_copy(update=update)


def test_same_seed_same_order_different_seed_different_order():
    a = load_workload(_spec(seed=7)).conversations
    b = load_workload(_spec(seed=7)).conversations
    c = load_workload(_spec(seed=8)).conversations
    assert a == b
    assert [x.id for x in a] != [x.id for x in c]
    assert sorted(x.id for x in a) == sorted(x.id for x in c)  # a reorder, not a resample


def test_order_is_the_seeded_numpy_permutation():
    ids = [c.id for c in load_workload(_spec("humaneval", seed=3)).conversations]
    perm = np.random.default_rng(3).permutation(164)
    assert ids == [f"humaneval/{i}" for i in perm]


def test_limit_keeps_first_n_of_the_shuffled_order():
    full = load_workload(_spec(seed=5)).conversations
    first = load_workload(_spec(seed=5, limit=25))
    assert first.conversations == full[:25]
    assert len(first.input_tokens) == 25


def test_prompts_hash_tracks_order_and_system_prompt():
    a = load_workload(_spec("mt-bench", seed=1))
    b = load_workload(_spec("mt-bench", seed=1))
    c = load_workload(_spec("mt-bench", seed=2))
    d = load_workload(_spec("mt-bench", seed=1, system_prompt="Be brief."))
    assert a.prompts_sha256() == b.prompts_sha256()
    assert a.prompts_sha256() != c.prompts_sha256()
    assert a.prompts_sha256() != d.prompts_sha256()
    assert all(conv.system == "Be brief." for conv in d.conversations)
    man = a.manifest()
    assert man["conversations"] == 80 and man["source"]["sha256"] == a.source.sha256
    assert man["spec"]["seed"] == 1
