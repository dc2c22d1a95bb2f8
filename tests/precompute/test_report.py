"""The precompute summary names what a user must act on: here, template hits left unused."""

from featurecache.precompute.report import PrecomputeSummary


def test_summary_says_why_template_hits_were_not_used():
    summary = PrecomputeSummary(cache_dir="/c", targets=3)
    for hits in (258, 0, 100):
        summary.count_unplaced_templates(hits)
    text = summary.format()
    assert (summary.unplaced_template_hits, summary.targets_with_unplaced_templates) == (358, 2)
    assert "358 in 2 target(s)" in text and "--templates" in text
    assert summary.to_dict()["unplaced_template_hits"] == 358


def test_summary_is_silent_when_every_hit_was_placed():
    summary = PrecomputeSummary(cache_dir="/c", targets=1)
    summary.count_unplaced_templates(0)
    assert "template folder" not in summary.format()
