"""The options a dataset build hands Beam: one view per class, and copies that stand alone."""

from __future__ import annotations

import copy
import pickle

from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    StandardOptions,
    TypeOptions,
)

from research.data.runners import IN_PROCESS_RUNNER, BuildOptions, pipeline_options


def test_a_class_is_viewed_once_and_every_view_shares_the_values() -> None:
    options = BuildOptions(["--direct_num_workers", "3"])
    first = options.view_as(TypeOptions)
    assert options.view_as(TypeOptions) is first
    first.pipeline_type_check = False
    assert options.view_as(TypeOptions).pipeline_type_check is False
    assert options.get_all_options()["pipeline_type_check"] is False
    assert options.view_as(DirectOptions).direct_num_workers == 3


def test_views_answer_as_beams_own_options_do() -> None:
    argv = ["--runner", "DirectRunner", "--direct_num_workers", "2", "--no_pipeline_type_check"]
    ours, beams = BuildOptions(argv), PipelineOptions(argv)
    for cls in (StandardOptions, DirectOptions, TypeOptions):
        assert vars(ours.view_as(cls)._visible_options) == vars(beams.view_as(cls)._visible_options)
    assert ours.get_all_options() == beams.get_all_options()


def test_a_copy_has_views_of_its_own_values() -> None:
    options = pipeline_options([])
    options.view_as(TypeOptions)  # a view made before the copy
    duplicate = copy.deepcopy(options)
    duplicate.view_as(StandardOptions).runner = "somewhere else"
    assert options.view_as(StandardOptions).runner == IN_PROCESS_RUNNER
    assert duplicate.view_as(StandardOptions).runner == "somewhere else"


def test_pickled_options_carry_no_views() -> None:
    options = pipeline_options(["--direct_num_workers", "2"])
    options.view_as(DirectOptions)
    assert "_views" not in options.__getstate__()
    restored = pickle.loads(pickle.dumps(options))
    assert restored.view_as(DirectOptions).direct_num_workers == 2
    assert restored.view_as(StandardOptions).runner == IN_PROCESS_RUNNER
