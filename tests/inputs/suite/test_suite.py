from pathlib import Path

import pytest

from avbench.errors import SuiteError
from avbench.inputs.suite import default_suites_dir, load_suite

SEED_PAIRS = {"dsv4-dspark", "mimo-dflash", "inkling-mtp", "muse-dflash2", "tiny-cpu"}


def test_shipped_suites_define_seed_pairs_workloads_and_sweeps():
    suite = load_suite()
    assert SEED_PAIRS <= set(suite.pairs)
    assert {"gsm8k", "humaneval", "mt-bench", "speed-bench-2k-low", "speed-bench-2k-high"} <= set(
        suite.workloads
    )
    default = suite.sweep("default")
    assert default.concurrencies == [1, 2, 4, 8, 16, 32, 64]
    assert default.sampling.temperature == 1.0 and default.sampling.top_p == 0.95
    assert default.num_requests(1) == 32 and default.num_requests(64) == 512
    mimo = suite.pair("mimo-dflash")
    assert mimo.gpus_per_server == 4 and mimo.method == "dflash" and mimo.max_k == 8


def test_suites_come_from_the_environment_then_the_working_directory_then_the_package(
    suites_copy: Path, tmp_path: Path, monkeypatch
):
    import avbench

    shipped = Path(avbench.__file__).parent / "suites"
    monkeypatch.delenv("AVBENCH_SUITES", raising=False)
    monkeypatch.chdir(tmp_path / "suites")  # a working directory with no ./suites
    assert default_suites_dir() == shipped and (shipped / "pairs.toml").is_file()
    (tmp_path / "suites" / "suites").mkdir()  # ./suites without a pairs.toml is not a suite
    assert default_suites_dir() == shipped
    monkeypatch.chdir(tmp_path)
    assert default_suites_dir() == suites_copy
    monkeypatch.setenv("AVBENCH_SUITES", str(tmp_path / "elsewhere"))
    assert default_suites_dir() == tmp_path / "elsewhere"


def test_tiny_pair_resolves_to_shipped_assets():
    pair = load_suite().pair("tiny-cpu")
    target = Path(pair.resolve(pair.target))
    assert target.name == "target" and target.parent.name == "tiny"
    assert pair.resolve("org/model") == "org/model"


def test_a_derived_target_is_derived_on_first_resolution_only(tmp_path: Path, monkeypatch, capsys):
    """tiny-cpu-wide's target is "@derived/tiny-wide": loading the suite (`avbench pairs`)
    leaves the cache alone; the first resolution derives it with one line on stderr, the next
    finds it (avbench/assets/derived.py)."""
    pytest.importorskip("torch")
    from avbench.assets import derived

    monkeypatch.setenv("AVBENCH_CACHE", str(tmp_path))
    pair = load_suite().pair("tiny-cpu-wide")
    assert (pair.target, pair.max_k, pair.k_values) == ("@derived/tiny-wide", 3, [1, 3])
    assert list(tmp_path.iterdir()) == []
    target = pair.resolve(pair.target)
    want = tmp_path / "derived" / f"tiny-wide-{derived.recipe('tiny-wide').key()}" / "target"
    assert target == str(want) and (want / "model.safetensors").is_file()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("avbench: deriving @derived/tiny-wide (width 24576")
    assert pair.resolve(pair.target) == target and capsys.readouterr().err == ""
    assert pair.resolve(pair.drafter) == pair.resolve(load_suite().pair("tiny-cpu").target)


def test_unknown_pair_lists_the_defined_ones():
    with pytest.raises(SuiteError, match=r"unknown pair 'nope' .*tiny-cpu"):
        load_suite().pair("nope")


def test_malformed_toml_names_the_file(suites_copy: Path):
    (suites_copy / "pairs.toml").write_text("[pairs.x\ntarget = 1\n")
    with pytest.raises(SuiteError) as exc:
        load_suite(suites_copy)
    msg = str(exc.value)
    assert "pairs.toml" in msg and "not valid TOML" in msg and "\n" not in msg


def test_wrong_field_type_names_file_and_field(suites_copy: Path):
    text = (suites_copy / "pairs.toml").read_text().replace("max_k = 3", 'max_k = "three"', 1)
    (suites_copy / "pairs.toml").write_text(text)
    with pytest.raises(
        SuiteError, match=r"pairs\.toml: pairs\.tiny-cpu\.max_k: .*integer.*'three'"
    ):
        load_suite(suites_copy)


def test_unknown_field_is_rejected(suites_copy: Path):
    p = suites_copy / "sweeps.toml"
    p.write_text(p.read_text().replace("repeats = 2", "repeat = 2", 1))
    with pytest.raises(SuiteError, match=r"sweeps\.toml: sweeps\.default\.repeat: Extra inputs"):
        load_suite(suites_copy)


def test_missing_file(suites_copy: Path):
    (suites_copy / "workloads.toml").unlink()
    with pytest.raises(SuiteError, match="workloads.toml: suite file not found"):
        load_suite(suites_copy)


def test_sweep_with_unknown_workload(suites_copy: Path):
    p = suites_copy / "sweeps.toml"
    p.write_text(p.read_text().replace('"gsm8k-tiny", "humaneval-tiny"', '"gsm8k-tiny", "nope"'))
    with pytest.raises(SuiteError, match=r"sweeps\.demo\.workloads: unknown workload 'nope'"):
        load_suite(suites_copy).sweep("demo")


def test_bad_concurrency_list(suites_copy: Path):
    p = suites_copy / "sweeps.toml"
    p.write_text(p.read_text().replace("concurrencies = [1, 4]", "concurrencies = [0, 4]"))
    with pytest.raises(SuiteError, match=r"sweeps\.demo\.concurrencies: .*positive"):
        load_suite(suites_copy)
