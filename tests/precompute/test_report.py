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


def test_progress_bars_draw_only_on_a_terminal(monkeypatch):
    """Enabled bars redraw in place on a terminal; into a log file they would write a `\\r` line
    per redraw, so there they stay silent (and always when disabled)."""
    import io

    from featurecache.precompute.report import progress_bars

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, enabled, drawn in ((Terminal(), True, True), (io.StringIO(), True, False), (Terminal(), False, False)):
        monkeypatch.setattr("sys.stderr", stream)
        bar = progress_bars(enabled)(total=3, desc="featurize")
        bar.update(3)
        assert bool(bar.disable) is not drawn  # before close(), which sets it
        bar.close()
        assert ("featurize" in stream.getvalue()) is drawn
