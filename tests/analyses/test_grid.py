"""The grid engine over_checkpoints and studies share: jobs, one option router, one job loop, errors per job."""

from __future__ import annotations

import pytest

from geolens._validation import DEFAULT_N_TOKENS, UpperBound
from geolens.analyses.checkpoints import over_checkpoints
from geolens.analyses.grid import (SHARED_OPTIONS, Job, UnknownOptionError, check_shared_options, resolve_jobs,
                                   route_options, run_jobs)
from geolens.results import Result


def sampled(model, tokens, *, k=1, n_tokens=DEFAULT_N_TOKENS, seed=0, batch_size=8, max_length=None,
            progress=True):
    return Result(rows=[{"layer": 0, "k": k, "n_tokens": n_tokens, "seed": seed}],
                  params={"tokens": tokens, "progress": progress, "processing": {"seconds": 1.0}})


def weights(model, *, scale=1.0):
    return Result(rows=[{"layer": 0, "scale": scale}], params={"model": model})


def scaled(model, tokens, *, scale=1.0):
    return Result(rows=[{"layer": 0, "scale": scale}])


def loose(model, tokens, **options):
    return Result(rows=[{"layer": 0, "n": len(options)}], params=dict(options))


def broken(model, tokens, *, seed=0):
    raise RuntimeError("broke on purpose")


TABLE = {"sampled": (sampled, True), "weights": (weights, False), "loose": (loose, True), "broken": (broken, True)}


def test_resolve_jobs_reads_the_table_and_takes_callables():
    jobs = resolve_jobs(["sampled", "weights", len], TABLE)
    assert jobs == [Job("sampled", sampled, True), Job("weights", weights, False), Job("len", len, True)]
    assert resolve_jobs("weights", TABLE) == [Job("weights", weights, False)]
    with pytest.raises(ValueError, match="unknown analysis 'nope'; choose from"):
        resolve_jobs(["nope"], TABLE)
    with pytest.raises(ValueError, match="no analyses given"):
        resolve_jobs([], TABLE)
    with pytest.raises(ValueError, match="repeat a name"):
        resolve_jobs(["sampled", sampled], TABLE)


def test_shared_options_go_where_they_are_taken_and_own_options_win():
    jobs = resolve_jobs(["sampled", "weights", "loose"], TABLE)
    routed = route_options(jobs, {"sampled": {"k": 5, "seed": 7}, "weights": {"scale": 2.0}},
                           {"n_tokens": 64, "seed": 1})
    assert routed == {"sampled": {"n_tokens": 64, "seed": 7, "k": 5}, "weights": {"scale": 2.0},
                      "loose": {"n_tokens": 64, "seed": 1}}  # **options takes every shared one
    assert route_options(jobs) == {"sampled": {}, "weights": {}, "loose": {}}
    # a default upper bound stays one ("at most"); a number given by hand is exact
    bound = route_options(jobs, shared={"n_tokens": DEFAULT_N_TOKENS})["sampled"]["n_tokens"]
    assert isinstance(bound, UpperBound) and bound == 1024
    assert not isinstance(route_options(jobs, shared={"n_tokens": 1024})["sampled"]["n_tokens"], UpperBound)


def test_unknown_options_are_both_type_and_value_errors_and_name_the_analysis():
    jobs = resolve_jobs(["sampled", "weights"], TABLE)
    with pytest.raises(UnknownOptionError, match=r"analysis 'sampled' takes no options \['kk'\]; sampled\(\) takes "
                                                 r"no keyword arguments by those names \(its options: k, n_tokens"):
        route_options(jobs, {"sampled": {"kk": 3}})
    assert issubclass(UnknownOptionError, TypeError) and issubclass(UnknownOptionError, ValueError)
    with pytest.raises(UnknownOptionError, match=r"analysis 'weights' takes no options \['n_tokens'\]"):
        route_options(jobs, {"weights": {"n_tokens": 3}})
    with pytest.raises(UnknownOptionError, match=r"no analysis among \['sampled', 'weights'\] takes the keyword "
                                                 r"arguments \['nope'\]"):
        route_options(jobs, shared={"nope": 1, "k": 2})
    assert route_options(jobs, shared={"nope": 1, "k": 2}, strict=False) == {"sampled": {"k": 2}, "weights": {}}
    with pytest.raises(UnknownOptionError, match=r"'sampled' takes no options \['tokens'\]: the runner passes "
                                                 r"model, tokens itself"):
        route_options(jobs, {"sampled": {"tokens": [1]}})
    with pytest.raises(UnknownOptionError, match=r"takes no options \['progress'\]: the runner passes model, tokens, "
                                                 r"progress itself"):
        route_options(jobs, {"sampled": {"progress": True}}, reserved=("progress",))
    assert route_options(jobs, {"sampled": {"progress": False}})["sampled"] == {"progress": False}
    with pytest.raises(TypeError, match=r"sampled= \(the options of analysis 'sampled'\) must be a dict"):
        route_options(jobs, {"sampled": 3})
    with pytest.raises(ValueError, match=r"options for analyses \['other'\] that do not run"):
        route_options(jobs, {"other": {}})


@pytest.mark.parametrize("options, error, message", [
    ({"n_tokens": 2}, ValueError, "n_tokens must be >= 3, got 2"),
    ({"n_tokens": 3.0}, TypeError, "n_tokens must be an int"),
    ({"seed": -1}, ValueError, "seed must be >= 0"),
    ({"seed": None}, TypeError, "seed must be an int"),
    ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
    ({"max_length": 0}, ValueError, "max_length must be >= 1"),
])
def test_shared_sample_options_are_checked(options, error, message):
    with pytest.raises(error, match=message):
        check_shared_options(options)
    with pytest.raises(error, match=message):  # by the router too, before any model loads
        route_options(resolve_jobs(["sampled"], TABLE), shared=options)


def test_check_shared_options_keeps_what_is_valid():
    import numpy as np

    out = check_shared_options({"n_tokens": np.int64(5), "seed": 0, "max_length": None, "batch_size": 2, "k": "x"})
    assert out == {"n_tokens": 5, "seed": 0, "max_length": None, "batch_size": 2, "k": "x"}
    assert type(out["n_tokens"]) is int
    assert check_shared_options({"n_tokens": None}) == {"n_tokens": None}
    assert SHARED_OPTIONS == ("n_tokens", "seed", "batch_size", "max_length")


def test_run_jobs_runs_each_job_and_a_failure_stays_with_its_job():
    jobs = resolve_jobs(["broken", "sampled", "weights"], TABLE)
    routed = route_options(jobs, {"sampled": {"k": 4}}, {"seed": 3})
    outcomes = list(run_jobs("the model", ["a text"], jobs, routed, progress=False))
    assert [o.name for o in outcomes] == ["broken", "sampled", "weights"]
    assert isinstance(outcomes[0].error, RuntimeError) and outcomes[0].result is None
    assert outcomes[1].error is None and outcomes[1].result.rows == [{"layer": 0, "k": 4, "n_tokens": 1024, "seed": 3}]
    # progress goes to the functions that take it; the reported params leave out the processing log
    assert outcomes[1].params == {"tokens": ["a text"], "progress": False}
    assert outcomes[2].params == {"model": "the model"}  # weights reads no tokens and takes no progress
    assert all(o.seconds >= 0 for o in outcomes)


def test_run_jobs_reads_what_inputs_gives_each_job():
    jobs = resolve_jobs(["sampled", "loose"], TABLE)
    seen = []

    def inputs(job, options):
        seen.append((job.name, dict(options)))
        if job.name == "loose":
            raise ValueError("no states for loose")
        return f"states for {job.name}"

    outcomes = list(run_jobs("m", "texts", jobs, {"sampled": {"seed": 2}}, inputs=inputs))
    assert outcomes[0].result.params["tokens"] == "states for sampled"
    assert isinstance(outcomes[1].error, ValueError)  # an error in inputs is the job's own
    assert seen == [("sampled", {"seed": 2}), ("loose", {})]


def test_over_checkpoints_checks_its_options_before_loading_anything():
    loads = []

    def load(label):
        loads.append(label)
        return "model"

    with pytest.raises(ValueError, match="n_tokens must be >= 3"):
        over_checkpoints(["a", "b"], ["text"], analyses=(sampled,), loader=load, n_tokens=2)
    with pytest.raises(TypeError, match=r"analysis 'sampled' takes no options \['kk'\]"):
        over_checkpoints(["a", "b"], ["text"], analyses=(sampled,), loader=load, sampled=dict(kk=1))
    assert loads == []
    res = over_checkpoints(["a", "b"], ["text"], analyses=(sampled, scaled), loader=load, seed=4, scale=2.0,
                           sampled=dict(k=3), progress=False)
    assert loads == ["a", "b"]
    table = res.to_pandas()
    assert table.query("metric == 'sampled.seed'")["value"].tolist() == [4.0, 4.0]
    assert table.query("metric == 'scaled.scale'")["value"].tolist() == [2.0, 2.0]
    assert res.params["analysis_params"]["sampled"] == {"tokens": ["text"], "progress": False}


def test_a_study_routes_options_with_the_same_router():
    from geolens.study import Study
    from geolens.analyses import registry

    study = Study(models={"a": "x"}, texts=["a b c"], analyses={"pga": {"k": 4}, "weights": {}}, n_tokens=64, seed=2)
    jobs = resolve_jobs(["pga", "weights"], registry.jobs_table("study"))
    expected = route_options(jobs, {"pga": {"k": 4}, "weights": {}},
                             {"n_tokens": 64, "seed": 2, "batch_size": 8, "max_length": None}, strict=False)
    assert study.cells()[0].analyses == expected
    assert expected["weights"] == {}
    default = Study(models={"a": "x"}, texts=["a b c"], analyses={"pga": {}}).cells()[0].analyses["pga"]
    assert isinstance(default["n_tokens"], UpperBound)  # the study's default sample size is an upper bound
    with pytest.raises(ValueError, match=r"analysis 'pga' takes no options \['progress'\]"):
        Study(models={"a": "x"}, texts=["a b c"], analyses={"pga": {"progress": True}}).cells()
