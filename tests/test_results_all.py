"""results_all: argument handling (no suite is run here)."""

from nexus_cli.stages import results_all


def test_unknown_suite_is_a_usage_error(capsys):
    assert results_all.main(["--only", "nope"]) == 2
    assert "unknown suite" in capsys.readouterr().err


def test_order_covers_every_suite():
    assert results_all.ORDER == ["slb", "l0", "deep-splice", "dkl", "gate", "routing", "args"]


def test_summary_of_an_empty_tree(tmp_path):
    from nexus_cli.stages import results_summary

    text = results_summary.render(tmp_path)
    assert text.startswith("# Latest results")
    assert text.count("_not run yet_") == len(results_summary.SECTIONS)
