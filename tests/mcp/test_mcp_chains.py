"""get_causal_chains on the bundled H200 traces: every chain up to top_n arrives, most severe first,
shrunk inside itself rather than dropped, with the same findings in the text and the structured half
(Claude Code forwards only the structured half); evidence SQL only on request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from paths import REPO

from ingero_mcp.analysis.chains import causal_chains
from ingero_mcp.analysis.window import resolve_window
from ingero_mcp.mcp.render import TEXT_BUDGET
from ingero_mcp.mcp.budget import STRUCTURED_BUDGET
from ingero_mcp.mcp.server import build_server
from ingero_mcp.sanitize import DATA_NOTE
from ingero_mcp.store import open_store

H200 = [REPO / "investigations" / "h200-seed-benchmark.duckdb",
        REPO / "investigations" / "h200-seed-benchmark-v1.duckdb"]
RANK = {"HIGH": 0, "MEDIUM": 1, "LOW": 2}


async def ask(db: Path, *calls: tuple[str, dict[str, Any]]) -> list[Any]:
    server = build_server(db)
    try:
        async with Client(server) as client:
            return [await client.call_tool(name, args) for name, args in calls]
    finally:
        server.store.close()


def expected_ids(db: Path, since: str | None = None) -> list[str]:
    with open_store(db) as con:
        window = resolve_window(con, since=since) if since else None
        chains = causal_chains(con, window)
    return [c.id for c in sorted(chains, key=lambda c: RANK[c.severity])]


def json_len(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


@pytest.mark.parametrize("db", H200, ids=lambda p: p.stem)
@pytest.mark.parametrize("since", [None, "25s"])
async def test_every_chain_arrives_most_severe_first_within_the_budgets(db: Path, since: str | None) -> None:
    (result,) = await ask(db, ("get_causal_chains", {"since": since} if since else {}))
    assert not result.is_error, result.content[0].text
    got = result.structured_content
    want = expected_ids(db, since)
    assert len(want) >= 1
    assert [c["id"] for c in got["chains"]] == want  # all of them (1 of 6 and 0 of 3 before), in severity order
    assert got["shown"] == got["total"] == len(want) and got["truncated"] is False
    assert [RANK[c["severity"]] for c in got["chains"]] == sorted(RANK[c["severity"]] for c in got["chains"])
    assert json_len(got) <= STRUCTURED_BUDGET and len(result.content[0].text) <= TEXT_BUDGET
    assert all("sql" not in e for c in got["chains"] for e in c.get("evidence", []))


def test_a_large_chain_shrinks_inside_itself_and_says_what_it_left_out() -> None:
    """Under a budget too small for them whole, the chains give up detail (largest first) before any is dropped."""
    from ingero_mcp.mcp.chainview import _block, chain_view, fit_chains

    with open_store(H200[0]) as con:
        chains = causal_chains(con)
        origin = con.execute("SELECT min(started_ns) FROM sessions").fetchall()[0][0]
    whole = [chain_view(c, origin) for c in chains]
    json_budget = sum(json_len(v) for v in whole) // 2
    text_budget = sum(len(_block(v)) for v in whole) // 2
    views, notes = fit_chains(chains, origin, json_budget, text_budget)
    assert len(views) == len(chains), "every chain arrives, shrunk"
    shrunk = [v for v in views if v.get("omitted")]
    assert shrunk and any("shortened to fit" in n for n in notes)
    assert sum(json_len(v) for v in views) <= json_budget
    for v in shrunk:
        assert v["summary"]  # the finding itself stays


async def test_text_and_structured_halves_carry_the_same_findings() -> None:
    (result,) = await ask(H200[0], ("get_causal_chains", {}))
    got, text = result.structured_content, result.content[0].text
    assert got["data_note"] == DATA_NOTE and DATA_NOTE in text
    for chain in got["chains"]:
        assert f"[{chain['severity']}] {json.dumps(chain['id'])}" in text
        assert json.dumps(chain["summary"], ensure_ascii=False) in text
        if "root_cause" in chain:
            assert json.dumps(chain["root_cause"], ensure_ascii=False) in text
        for key in ("p50", "p99", "max"):
            if key in chain["numbers"]:
                assert f"{key} {chain['numbers'][key]}" in text  # readable, the same string in both halves
        for e in chain.get("evidence", []):
            assert json.dumps(e["name"], ensure_ascii=False) in text
        for t in chain.get("timeline", []):
            assert t["at"].startswith("+") and f"timeline {t['at']} " in text  # readable offsets in both halves
        for rec in chain.get("recommendations", []):
            assert json.dumps(rec, ensure_ascii=False) in text


async def test_evidence_sql_on_request_recomputes_the_value() -> None:
    chains, = await ask(H200[0], ("get_causal_chains", {"top_n": 2}))
    first = chains.structured_content["chains"][0]
    with_sql, evidence, missing = await ask(
        H200[0],
        ("get_causal_chains", {"top_n": 1, "include_sql": True}),
        ("get_evidence_sql", {"chain_id": first["id"]}),
        ("get_evidence_sql", {"chain_id": "no-such-chain"}),
    )
    one = with_sql.structured_content["chains"][0]
    assert any("sql" in e for e in one.get("evidence", [])), one.get("omitted")
    assert json_len(with_sql.structured_content) <= STRUCTURED_BUDGET
    items = evidence.structured_content["evidence"]
    assert evidence.structured_content["chain_id"] == first["id"] and items
    assert missing.is_error and first["id"] in missing.content[0].text  # it lists the chains there are
    checked = 0
    for item in items:
        if not item.get("sql") or not isinstance(item["value"], int):
            continue
        assert item["sql"] in evidence.content[0].text  # whole, in the text too
        (rows,) = await ask(H200[0], ("run_sql", {"sql": item["sql"]}))
        assert rows.structured_content["rows"][0][0] == item["value"], item["name"]
        checked += 1
    assert checked >= 1


async def test_evidence_without_a_chain_id_where_there_is_none_says_so() -> None:
    """Asked for a window's evidence (no chain_id) where no chain was found: the error says there is none, and names
    no chain id the caller did not give."""
    (got,) = await ask(H200[0], ("get_evidence_sql", {"since": "1ms"}))
    assert got.is_error and "no causal chain in this window; chains here: none" in got.content[0].text
    assert 'no chain ""' not in got.content[0].text


def test_fields_the_analysis_adds_later_are_rendered_in_both_halves() -> None:
    """The chain model will grow (a seconds_lost, an accounting): views and text carry unknown fields generically."""
    from ingero_mcp.analysis.models import CausalChain, Evidence
    from ingero_mcp.mcp.chainview import chain_view, chains_text, fit_chains

    class RicherEvidence(Evidence):
        share: float | None = None

    class RicherChain(CausalChain):
        evidence: list[RicherEvidence] = []  # type: ignore[assignment]
        seconds_lost: float | None = None
        accounting: dict[str, Any] = {}
        verdict_at_ns: int | None = None

    t0 = 1_700_000_000_000_000_000
    chain = RicherChain(
        id="ingero-mcp:x", op="cudaStreamSynchronize", severity="HIGH", summary="s", root_cause="r", explanation="e",
        evidence=[RicherEvidence(name="preempted", value=12, unit="ms", sql="SELECT 12", share=0.4)],
        seconds_lost=3.25, accounting={"running_s": 1.5, "waiting_for_cpu_s": 1.75}, verdict_at_ns=t0 + 2_500_000_000,
    )
    view = chain_view(chain, t0)
    assert view["seconds_lost"] == 3.25 and view["accounting"] == {"running_s": 1.5, "waiting_for_cpu_s": 1.75}
    assert view["verdict_at_at"] == "+2.500000 s"  # a moment gains its offset, whatever its name
    assert view["evidence"] == [{"name": "preempted", "value": 12, "unit": "ms", "share": 0.4}]  # no SQL by default
    text = chains_text([view])
    assert "seconds_lost: 3.25" in text and '"waiting_for_cpu_s": 1.75' in text and "share 0.4" in text
    assert "SELECT 12" not in text
    small, _ = fit_chains([chain], t0, json_budget=250, text_budget=250)
    assert small[0]["omitted"].get("seconds_lost") == 1 and "left out to fit" in chains_text(small)
