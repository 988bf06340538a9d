"""The UI's history table: the figures first (on screen in a 1400 px window), the run last and
short, since its full name repeats the partitions and the start the row shows on its own."""

from __future__ import annotations

from eagle3_datagen.report.history import history_rows, ui_history_rows


def _entry(name: str, attempt: int = 1) -> dict[str, object]:
    part = {"status": "completed", "records": 98, "accept_rate": 0.99, "tok_s": 1012.4}
    return {
        "run_name": name,
        "attempt": attempt,
        "started": "2026-11-29T02:00:00+00:00",
        "partitions": {"B1_glaive": part},
    }


def test_the_ui_table_leads_with_figures_and_ends_with_a_short_run_name() -> None:
    rows = history_rows(
        [
            _entry("kimi-k2.5: B1_glaive+B2_toolace+B3_hermes 2026-11-29 02:00Z"),
            _entry("kimi-k2.5: B1_glaive 2026-11-30 02:00Z", attempt=2),
            _entry("poised-tuna"),
        ],
        all_attempts=True,
    )
    ui = ui_history_rows(rows)
    assert [r["run"] for r in ui] == ["kimi-k2.5", "kimi-k2.5 (attempt 2)", "poised-tuna"]
    assert list(ui[0])[-1] == "run"
    assert list(ui[0])[:4] == ["started", "partition", "status", "records"]
    # The same figures as the command line's rows.
    assert [{k: v for k, v in r.items() if k != "run"} for r in ui] == [
        {k: v for k, v in r.items() if k != "run"} for r in rows
    ]
