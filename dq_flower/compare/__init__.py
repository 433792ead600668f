"""`dq-flower compare`: plan, run, summarise and plot a comparison of methods.

Run a list of methods on one scenario and report bytes vs accuracy. Every method runs with
the same data set, model, partition, clients, rounds and seed, in Flower's simulation
engine (:func:`dq_flower.harness.simulate`, one Ray simulation per method) or in-process
(:class:`dq_flower.harness.inprocess.InProcessGrid`, fast, for tests and quick looks). The
output folder receives

* ``results.json``: the scenario, every run's config and per-round history, its summary
  (a failed run: ``"failed": true`` and its error);
* ``results.csv``: one row per method and round (accuracy, loss, up and down bytes of the
  round and cumulated, wall time, and the method's own metrics);
* ``summary.md``: per method D, d, uplink bits per sample or per coordinate, final accuracy,
  rounds and uplink bytes to the target accuracy, and the ratio of those bytes to DQ's;
* ``accuracy_vs_uplink.png`` (cumulative uplink bytes, log axis),
  ``accuracy_vs_rounds.png`` and ``accuracy_vs_time_<link>.png`` per link profile.

``summary.md`` and the plots are functions of ``results.json`` alone
(:func:`write_reports`), so ``dq-flower report DIR`` redraws them without rerunning.
"""

from dq_flower.compare.links import BUILTIN_LINKS, LinkProfile, parse_link, parse_links
from dq_flower.compare.reports import (
    CSV_COLUMNS,
    RESULTS_FORMAT,
    load_results,
    write_csv,
    write_plots,
    write_reports,
)
from dq_flower.compare.run import (
    ENGINES,
    SCENARIO_KEYS,
    ConsoleProgress,
    PlannedRun,
    check_data,
    parse_set,
    plan_runs,
    run_comparison,
)
from dq_flower.compare.summary import (
    REFERENCE,
    UNSTABLE_DROP,
    error_line,
    failed_runs,
    fmt_bytes,
    is_failed,
    run_summaries,
    summary_markdown,
)

__all__ = ["ENGINES", "BUILTIN_LINKS", "LinkProfile", "parse_link", "parse_links",
           "UNSTABLE_DROP", "SCENARIO_KEYS", "RESULTS_FORMAT", "REFERENCE", "PlannedRun",
           "ConsoleProgress", "plan_runs", "check_data", "run_comparison", "run_summaries",
           "write_reports", "write_csv", "write_plots", "summary_markdown", "CSV_COLUMNS",
           "load_results", "parse_set", "fmt_bytes", "is_failed", "failed_runs", "error_line"]
