"""What a researcher reads in every surface says the same thing the same way: money (one formatter),
calls (one way of counting, in ``show``, the Runs row and receipts), a damaged run's error in its
own field, one hint for a missing run, and an export with one title."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import need_module

import caravanserai
from caravanserai import durable
from caravanserai.calls.ledger import calls_text
from caravanserai.calls.models import Model, ModelResponse, Usage
from caravanserai.calls.pricing import register_price, usd_text
from caravanserai.cli import main as cli_main
from caravanserai.errors import LIST_HINT, RunNotFound
from caravanserai.panels.export import export_runs, render_html
from caravanserai.panels.timeline import TimelineSource
from caravanserai.runs.index import list_runs
from caravanserai.runs.view import inspect_run

PRICE = (1.0, 2.0)  # USD per million tokens in, out


class Priced(Model):
    """A deterministic model with a list price, so the USD figures are not all zero."""

    provider, name = "test", "polish-priced-1"

    def complete(self, messages, *, tools=None, **params):
        return ModelResponse(f"answer {len(messages)}", Usage(100, 20), (), self.name, None)


@pytest.fixture(autouse=True)
def prices():
    register_price(Priced.name, *PRICE)


# ---- money ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("usd", "text"), [
    (None, "unpriced"), (0, "$0"), (0.0, "$0"), (12.345678, "$12.35"), (1, "$1.00"), (1234.5, "$1234.50"),
    (0.015, "$0.015"), (0.00042, "$0.00042"), (0.000123, "$0.000123"), (0.0001234567, "$0.000123"),
    (0.00028, "$0.00028"), (0.5, "$0.5"), (0.999, "$0.999"), (0.9996, "$1.00"), (2e-6, "$0.000002"),
    (1.23e-5, "$0.0000123"), (-0.0012, "-$0.0012"),
])
def test_usd_text_reads_plain_dollars_with_significant_digits(usd, text):
    assert usd_text(usd) == text
    assert usd is None or "e" not in text  # never exponent notation


def test_usd_text_says_unpriced_for_an_unknown_price():
    assert usd_text(0.5, priced=False) == "unpriced" and usd_text(None, priced=True) == "unpriced"


# ---- one way of counting calls -----------------------------------------------------------------
def counted_run(store) -> None:
    """Attempt 1: a model call and a tool call, then a failure; attempt 2 replays both, makes one more model call."""
    with pytest.raises(RuntimeError), durable("counted", store=store) as run:
        run.call_model(Priced(), [{"role": "user", "content": "one"}], path="p")
        run.call_tool(lambda x: x * 2, {"x": 1}, name="double", effect="idempotent")
        raise RuntimeError("boom")
    with durable("counted", store=store) as run:
        run.call_model(Priced(), [{"role": "user", "content": "one"}], path="p")  # replayed: not a new call
        run.call_tool(lambda x: x * 2, {"x": 1}, name="double", effect="idempotent")  # replayed
        run.call_model(Priced(), [{"role": "user", "content": "two"}], path="p")
        run.checkpoint({"ok": 1}, "done")


def test_show_the_runs_row_and_the_receipt_count_calls_alike(project, capsys):
    counted_run(None)
    view = inspect_run("counted")
    assert [(c.kind, c.replayed_in) for c in view.calls] == [("model", (2,)), ("tool", (2,)), ("model", ())]
    usd = round(2 * (100 * PRICE[0] + 20 * PRICE[1]) / 1e6, 10)
    assert usd_text(usd) == "$0.00028"

    (entry,) = list_runs(caravanserai.open_store(None))
    row = entry.row
    assert (row["calls"], row["model_calls"], row["tool_calls"], row["unanswered_calls"]) == (3, 2, 1, 0)
    assert row["calls_text"] == "3 calls (2 model, 1 tool)" and row["replayed"] == 2
    assert row["usd"] == usd and row["usd_text"] == "$0.00028" and row["error"] is None

    assert cli_main(["show", "counted"]) == 0
    out = capsys.readouterr().out
    assert "receipt: 3 calls (2 model, 1 tool), 240 tokens, $0.00028 (inferred from public list prices)" in out

    receipt = view.receipt  # the ledger knows model calls only: the same 2, in the same words
    assert len(receipt.calls) == row["model_calls"]
    assert receipt.summary() == "2 model calls, 240 tokens, $0.00028 (inferred from public list prices)"
    assert "$0.00028" in receipt._repr_mimebundle_()["text/html"]
    assert "receipt: 3 calls (2 model, 1 tool)" in view._repr_mimebundle_()["text/plain"]


def test_calls_text_words():
    assert calls_text(0) == "no calls" and calls_text(1) == "1 model call" and calls_text(2) == "2 model calls"
    assert calls_text(2, 1) == "3 calls (2 model, 1 tool)" and calls_text(0, 1) == "1 call (1 tool)"
    assert calls_text(4, 5, 2) == "11 calls (4 model, 5 tool, 2 unanswered)"


def test_a_run_without_calls_costs_zero_dollars(project, capsys):
    with durable("quiet") as run:
        run.checkpoint({"i": 1}, "one")
    row = inspect_run("quiet").as_row()
    assert (row["calls"], row["calls_text"], row["usd_text"]) == (0, "no calls", "$0")
    assert inspect_run("quiet").receipt.summary() == "no calls, 0 tokens, $0 (inferred from public list prices)"
    assert cli_main(["show", "quiet"]) == 0 and "$0.0" not in capsys.readouterr().out


def test_a_receipt_of_unpriced_calls_only_is_unpriced_not_zero(project):
    class Unpriced(Priced):
        name = "polish-no-price-model"

    with durable("unpriced") as run:
        run.call_model(Unpriced(), [{"role": "user", "content": "?"}], path="p")
    view = inspect_run("unpriced")
    assert view.receipt.usd_text() == "unpriced" and view.as_row()["usd_text"] == "unpriced"
    assert view.calls_df()["usd"].isna().all()


def test_the_journal_summary_and_the_status_line_use_the_same_money(project):
    counted_run(None)
    settled = [s for s in inspect_run("counted").journal_df()["summary"] if " settled: " in s and "tokens" in s]
    assert len(settled) == 2 and all(s.endswith(" settled: 100+20 tokens, $0.00014") for s in settled), settled


def test_the_resumable_status_line_says_calls_and_money_as_show_does(project, capsys):
    need_module("IPython", "notebook")
    from caravanserai.ipython_ext.cell import StatusLine  # no shell: the line is printed, and returned by text()

    with durable("status-line") as run:
        run.call_model(Priced(), [{"role": "user", "content": "one"}], path="p")
        run.call_model(Priced(), [{"role": "user", "content": "two"}], path="p")
        run.checkpoint({"i": 1}, "one")
        line = StatusLine(None, run, how=None, restored=set(), completed=False).text()
    assert "2 model calls, 240 tokens, $0.00028 (inferred)" in line and "$0.0003" not in line


# ---- a damaged run's error in its own field ----------------------------------------------------
def test_a_damaged_runs_row_carries_its_error_not_a_parent(project):
    caravanserai.checkpoint("broken", {"a": 1}, "one")
    caravanserai.checkpoint("broken", {"a": 2}, "two")
    caravanserai.runs.close_all()
    journal = project / ".caravanserai" / "broken" / "journal.jsonl"
    journal.write_text(journal.read_text().replace('"a":1', '"a":5'))  # breaks the hash chain
    (entry,) = list_runs(caravanserai.open_store(None))
    row = entry.row
    assert row["status"] == "damaged" and row["parent"] is None
    assert row["error"].startswith("JournalCorruptionError: ") and "does not chain" in row["error"]


def test_a_failed_runs_row_carries_its_failure(project):
    with pytest.raises(ValueError), durable("failing") as run:
        run.checkpoint({"i": 1}, "one")
        raise ValueError("no such column")
    row = inspect_run("failing").as_row()
    assert row["status"] == "failed" and row["error"] == "ValueError: no such column" and row["parent"] is None


# ---- one hint ------------------------------------------------------------------------------------
def test_a_missing_run_reads_the_same_hint_in_the_timeline_and_the_cli(project, capsys):
    caravanserai.checkpoint("other", {"a": 1}, "one")
    with pytest.raises(RunNotFound) as timeline:
        TimelineSource("nobody").poll()
    assert cli_main(["show", "nobody"]) == 1
    cli_error = capsys.readouterr().err.strip()
    assert cli_error.endswith(LIST_HINT) and str(timeline.value).endswith(LIST_HINT)
    assert "`caravanserai list`" in LIST_HINT and "`%caravanserai list` in a notebook" in LIST_HINT
    assert cli_error.split(": ", 2)[2].startswith("no run 'nobody' in ") and str(timeline.value).startswith("no run 'nobody'")


def test_no_other_wording_of_the_hint_is_left():
    root = Path(__file__).resolve().parents[1]
    sources = [*root.joinpath("caravanserai").rglob("*.py"), *root.joinpath("ipython_ext").rglob("*.py"),
               *root.joinpath("widgets").rglob("*.py"), *root.joinpath("widgets", "static").glob("*.js")]
    stray = [str(p) for p in sources if "check the id with" in p.read_text(encoding="utf-8") and p.name != "errors.py"]
    assert stray == []


# ---- one title in the export -----------------------------------------------------------------------
class Headings(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []
        self._open: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag in ("title", "h1", "h2"):
            self._open = tag
            self.found.append((tag, ""))

    def handle_endtag(self, tag):
        self._open = None

    def handle_data(self, data):
        if self._open:
            tag, text = self.found[-1]
            self.found[-1] = (tag, text + data)


def headings(text: str) -> list[tuple[str, str]]:
    parser = Headings()
    parser.feed(text)
    return parser.found


def test_the_export_has_one_title_shown_once_and_each_panels_heading(project):
    for name in ("alpha", "beta"):
        with durable(name) as run:
            run.checkpoint({"i": 1}, "one")
    page = Path(export_runs(["alpha", "beta"], "out/report.html")).read_text(encoding="utf-8")
    found = headings(page)
    h1 = [text for tag, text in found if tag == "h1"]
    assert h1 == ["Runs alpha and beta"] and "\n" not in h1[0]
    assert [text for tag, text in found if tag == "title"] == ["Runs alpha and beta"]
    assert [text for tag, text in found if tag == "h2"] == ["Timeline: alpha", "Timeline: beta", "Lineage: alpha",
                                                             "Compare: alpha vs beta"]

    one = Path(export_runs(["alpha"], "out/one.html", lineage=False)).read_text(encoding="utf-8")
    assert [(tag, text) for tag, text in headings(one) if tag != "title"] == [("h1", "Run alpha"), ("h2", "Timeline: alpha")]

    source = TimelineSource("alpha")
    source.poll()
    given = headings(render_html([source], title="Timeline: alpha"))  # a title equal to the only heading: shown once
    assert [text for tag, text in given if tag in ("h1", "h2")] == ["Timeline: alpha"]
    titled = headings(render_html([source], title="My appendix"))
    assert [(tag, text) for tag, text in titled if tag != "title"] == [("h1", "My appendix"), ("h2", "Timeline: alpha")]
    data = json.loads(one.split('id="cvs-data">', 1)[1].split("</script>", 1)[0])
    assert [p["heading"] for p in data["panels"]] == ["Timeline: alpha"]


def test_diff_prints_cost_deltas_in_the_same_dollars():
    from caravanserai.cli_checkpoints import _deltas

    assert _deltas({"cells": [{}, {"d_usd": 0.00042}, {"d_usd": -1.5}, {"d_usd": 0}]}) == "   (+$0.00042, -$1.50)"
