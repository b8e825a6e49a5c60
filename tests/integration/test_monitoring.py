"""examples/monitoring: the dashboard and alert rules read what ``lr server`` exports.

Every metric name the Grafana dashboard's queries and the alert rules use is
one the server's registry exports (taken from ``lr_server.metrics``, not from
a list); promtool checks the rules and runs their unit tests; a real
Prometheus scrapes running ``lr server`` processes, evaluates the rules and
answers every dashboard query.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry

from lr_client import RoutingQueueClient
from lr_client.listener_metrics import ListenerMetrics
from lr_client.sink_metrics import SinkCollector
from lr_client.store import SQLAlchemyQueueStore, open_store
from lr_client.store.ops.inspection import SinkBacklog, SinkFailures
from lr_client.store.ops.partition_lags import PartitionLag
from lr_server import metrics
from lr_server.cluster.retention import RetentionPolicy
from lr_server.config import RetentionConfig
from tests.integration.test_unconfigured import send, site_config
from tests.kit.procs import ROOT, LrServer, stop_all
from tests.kit.prometheus import Prometheus, binary, promtool
from tests.kit.promql import exported_samples, metric_names, rated_names
from tests.kit.sites import SiteSpec, free_port, wait_for, write_config

HERE = ROOT / "examples" / "monitoring"
DASHBOARD = HERE / "grafana-dashboard.json"
ALERTS = HERE / "alerts.yml"
ALERTS_TEST = HERE / "alerts_test.yml"
SCRAPE_CONFIG = HERE / "prometheus.yml"
README = HERE / "README.md"
MONITORING = ROOT / "docs" / "monitoring.md"

#: What the dashboard must show: send lag, shipped and applied rates, backpressure,
#: drops, full-sync state and progress, stream errors, process memory.
DASHBOARD_METRICS = {
    "lr_lag_seconds",
    "lr_entries_shipped_total",
    "lr_entries_applied_total",
    "lr_backpressure",
    "lr_drops_total",
    "lr_snapshot_active",
    "lr_snapshot_rows",
    "lr_errors_total",
    "lr_stream_stopped",
    "process_resident_memory_bytes",
    "lr_sink_queue_depth",
    "lr_sink_oldest_undelivered_seconds",
    "lr_sink_listener_batches_total",
    "lr_sink_apply_seconds_bucket",
}

#: Grafana's variables, as a test replaces them (every server, every destination).
GRAFANA_VARIABLES = {
    "$instance": ".*",
    "$destination": ".*",
    "$__rate_interval": "5s",
    "$__range": "1m",
}


# -- reading the files ------------------------------------------------------------------------
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that is not a row, rows' nested panels included."""
    for panel in board["panels"]:
        yield from (p for p in panel.get("panels", []) if p["type"] != "row")
        if panel["type"] != "row":
            yield panel


def dashboard_queries() -> list[str]:
    """The PromQL of every panel target, and of every query variable."""
    board = dashboard()
    exprs = [t["expr"] for p in panels(board) for t in p["targets"]]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            assert var["query"] == var["definition"], var["name"]
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", var["definition"])
            assert m, f"variable {var['name']}: {var['definition']}"
            exprs.append(m.group(1))
    return exprs


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def rule_test_cases() -> list[dict[str, Any]]:
    tests: list[dict[str, Any]] = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    return tests


def monitoring_tables() -> list[list[list[str]]]:
    """The tables of docs/monitoring.md's Prometheus section: rows of cells, header skipped."""
    text = MONITORING.read_text()
    section = text[text.index("\n## Prometheus, alerts and a dashboard") :]
    section = section[: section.index("\n## ", 1)]
    return markdown_tables(section)


def markdown_tables(text: str) -> list[list[list[str]]]:
    tables: list[list[list[str]]] = []
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):  # no cell of these tables holds a "|"
            rows.append([c.strip() for c in line.strip()[1:-1].split("|")])
        elif rows:
            tables.append(rows[2:])  # no header, no ---
            rows = []
    return tables


def documented_expressions() -> list[str]:
    """The PromQL of the further-expressions table of docs/monitoring.md."""
    further = monitoring_tables()[1]
    return [row[1].strip("`") for row in further]


def substituted(expr: str) -> str:
    """``expr`` with Grafana's variables replaced, as Prometheus will be asked it."""
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
    return expr


# -- names ------------------------------------------------------------------------------------
class _NoBacklog:
    @property
    def inspection(self) -> _NoBacklog:  # the store's inspection role: this fake plays it
        return self

    def sink_backlogs(self, client_name: str | None = None) -> list[SinkBacklog]:
        return []

    def sink_failures(self, client_name: str | None = None) -> SinkFailures:
        return SinkFailures({}, {})

    def sink_partition_lags(self, client_name: str | None = None) -> list[PartitionLag]:
        return [PartitionLag("policy", "site-a", 0, 0)]


def exported() -> dict[str, str]:
    """{sample name: type} of what ``lr server`` exports (its registry, after the import),
    with the sink's gauges (``lr_client.sink_metrics``: ``lr server`` serves them, an
    application may too) and the listener's (``lr_client.listener_metrics``: an
    application running a subscriber exports them)."""
    assert metrics.LAG_SECONDS is not None  # lr_server.metrics registered its families
    sink = CollectorRegistry(auto_describe=False)
    sink.register(SinkCollector(_NoBacklog()))
    ListenerMetrics(sink)
    return {**exported_samples(REGISTRY), **exported_samples(sink)}


def test_the_registry_exports_the_server_metrics_under_their_sample_names() -> None:
    samples = exported()
    assert samples["lr_drops_total"] == "counter" and "lr_drops" not in samples
    assert samples["lr_batch_latency_seconds_bucket"] == "histogram"
    assert samples["lr_lag_seconds"] == "gauge" and "lr_lag_seconds_total" not in samples
    assert samples["process_resident_memory_bytes"] == "gauge"


def test_every_metric_the_dashboard_and_the_rules_read_is_exported() -> None:
    samples = exported()
    used = {
        "dashboard": dashboard_queries(),
        "alerts.yml": [rule["expr"] for rule in alert_rules()],
        "docs/monitoring.md": documented_expressions(),
        "alerts_test.yml input series": [
            s["series"] for case in rule_test_cases() for s in case["input_series"]
        ],
    }
    for where, exprs in used.items():
        assert exprs, where
        for expr in exprs:
            names = metric_names(expr)
            assert names, f"{where}: no metric in {expr!r}"
            unknown = names - set(samples)
            assert not unknown, f"{where}: {sorted(unknown)} not exported, in {expr!r}"
            for name in rated_names(expr):
                kind = samples[name]
                assert kind in ("counter", "histogram") and not name.endswith("_created"), (
                    f"{where}: rate or increase of {name}, a {kind}, in {expr!r}"
                )


# -- the dashboard ----------------------------------------------------------------------------
def test_the_dashboard_takes_its_prometheus_datasource_from_a_variable() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    source = variables["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    shown = list(panels(board))
    assert shown
    for p in shown:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"], p["title"]
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_the_dashboard_shows_each_part_of_a_sites_health() -> None:
    shown = set().union(*(metric_names(e) for e in dashboard_queries()))
    assert DASHBOARD_METRICS - shown == set()


def test_the_dashboard_and_documented_queries_are_valid_promql(tmp_path: Path) -> None:
    exprs = [substituted(e) for e in dashboard_queries()] + documented_expressions()
    rules = {
        "groups": [
            {
                "name": "queries",
                "rules": [{"record": f"query:{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(json.dumps(rules))
    result = promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_readme_lists_the_dashboards_rows() -> None:
    rows = [p["title"] for p in dashboard()["panels"] if p["type"] == "row"]
    readme = markdown_tables(README.read_text())
    (listed,) = [t for t in readme if t and t[0][0] == "Replication"]
    assert [r[0] for r in listed] == rows


# -- the alert rules --------------------------------------------------------------------------
def test_the_docs_show_the_rules_as_they_are() -> None:
    def one_line(text: str) -> str:
        return " ".join(text.split())

    documented = {
        row[0].split(":")[0].strip("`"): (one_line(row[1].strip("`")), row[2], row[3])
        for row in monitoring_tables()[0]
    }
    assert documented == {
        r["alert"]: (one_line(r["expr"]), r.get("for", ""), r["labels"]["severity"])
        for r in alert_rules()
    }
    readme = markdown_tables(README.read_text())
    (listed,) = [t for t in readme if t and t[0][0].startswith("`Lr")]
    assert {row[0].strip("`"): row[2] for row in listed} == {
        r["alert"]: r["labels"]["severity"] for r in alert_rules()
    }


def test_promtool_checks_the_alert_rules() -> None:
    result = promtool("check", "rules", ALERTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_the_alert_rules_pass_their_unit_tests() -> None:
    result = promtool("test", "rules", ALERTS_TEST.name, cwd=HERE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_case_that_fires_and_one_that_does_not() -> None:
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names))
    cases = [c for test in rule_test_cases() for c in test["alert_rule_test"]]
    assert {c["alertname"] for c in cases} == set(names)
    for name in names:
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name}: no case where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{name}: no case where it stays quiet"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("lr_lag_seconds > 300", "lr_lag_seconds > 3000"),  # a threshold
        ("for: 5m # TUNE: how long a lag", "for: 15m # TUNE: how long a lag"),  # a for
        ("or time() - lr_drops_created < 15 * 60", ""),  # a stream's first drop
        ("expr: lr_stream_stopped == 1", "expr: lr_stream_stopped == 2"),
        ("increase(lr_errors_total[5m]) > 0", "increase(lr_errors_total[5m]) > 5"),
        ("expr: lr_backpressure == 1", "expr: lr_backpressure == 0"),
        ("changes(lr_snapshot_rows[30m]) > 0", "changes(lr_snapshot_rows[30m]) >= 0"),
        ("lr_sink_oldest_undelivered_seconds > 300", "lr_sink_oldest_undelivered_seconds > 3000"),
        ('{outcome!="accepted"}', '{outcome="accepted"}'),
        ("expr: lr_sink_metrics_up == 0", "expr: lr_sink_metrics_up == 1"),
        ("min_over_time(lr_sink_partition_behind", "max_over_time(lr_sink_partition_behind"),
    ],
)
def test_the_unit_tests_catch_a_changed_rule(tmp_path: Path, old: str, new: str) -> None:
    text = ALERTS.read_text()
    assert text.count(old) == 1
    (tmp_path / ALERTS.name).write_text(text.replace(old, new))
    (tmp_path / ALERTS_TEST.name).write_text(ALERTS_TEST.read_text())
    result = promtool("test", "rules", ALERTS_TEST.name, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "FAILED" in output and "alertname:" in output, output


def test_the_scrape_config_example_is_valid() -> None:
    result = promtool("check", "config", SCRAPE_CONFIG.name, cwd=HERE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


# -- the gauges the rules need ----------------------------------------------------------------
def test_retention_sets_the_backpressure_gauge_of_each_client(
    store: SQLAlchemyQueueStore,
) -> None:
    send(store, "policy", [(b"x", ["b", "c"])] * 3)
    policy = RetentionPolicy(store, site_config(store, RetentionConfig(max_entries=4)))

    def gauge() -> float | None:
        return REGISTRY.get_sample_value("lr_backpressure", {"client": "policy"})

    assert policy.run_once().backpressure == {"policy": True}  # b and c both slow
    assert gauge() == 1.0
    head = store.send.head_position()
    store.shipping.set_cursor("b", "policy", head)
    store.shipping.set_cursor("c", "policy", head)
    assert policy.run_once().backpressure == {"policy": False}
    assert gauge() == 0.0


# -- a real Prometheus ------------------------------------------------------------------------
@pytest.mark.slow
def test_prometheus_scrapes_running_sites_evaluates_the_rules_and_answers_the_dashboard(
    tmp_path: Path, db_url_factory: Callable[[str], str]
) -> None:
    """a ships to b; c and d are down: b catches up, backpressure turns on for policy."""
    binary("prometheus")
    port_b, port_c, port_d = free_port(), free_port(), free_port()
    metrics_ports = {"a": free_port(), "b": free_port()}
    urls = {s: db_url_factory(s) for s in ("a", "b")}
    retention = "[retention]\nmax_entries = 10\ntrim_interval = 0.2\nrotation_period = 0.5"
    cfg_a = write_config(
        tmp_path,
        SiteSpec(
            "a",
            urls["a"],
            destinations=[("b", port_b), ("c", port_c), ("d", port_d)],
            metrics_port=metrics_ports["a"],
            extra=retention,
        ),
    )
    cfg_b = write_config(
        tmp_path,
        SiteSpec("b", urls["b"], port=port_b, sources=["a"], metrics_port=metrics_ports["b"]),
    )
    stores = {s: open_store(urls[s]) for s in urls}
    for st in stores.values():
        st.create_schema()
    client = RoutingQueueClient(stores["a"], "a", "policy", backpressure="ignore")
    client.register_destinations(["b", "c", "d"])
    with stores["a"].engine.begin() as conn:
        for i in range(20):
            client.transmit_log_entry_message(conn, b"%d" % i, ["b", "c", "d"])
    scrape = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "lr",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{port}"], "labels": {"site": site}}
                    for site, port in metrics_ports.items()
                ],
            }
        ],
    }
    servers = [LrServer(cfg_b).start()]
    try:
        servers[0].wait_listening(port_b)
        servers.append(LrServer(cfg_a).start())
        with Prometheus(json.dumps(scrape), tmp_path / "prometheus") as prom:

            def reached(expr: str, labels: tuple[str, ...], want: dict[Any, float]) -> None:
                wait_for(
                    lambda: prom.values(expr, *labels) == want,
                    60,
                    what=f"{expr} = {want}",
                    detail=lambda: f"{prom.values(expr, *labels)}\n{servers[-1].log()}",
                )

            reached('up{job="lr"}', ("site",), {("a",): 1.0, ("b",): 1.0})
            reached(
                "lr_entries_shipped_total",
                ("site", "destination", "client"),
                {("a", "b", "policy"): 20.0},
            )
            reached(
                "lr_entries_applied_total",
                ("site", "source", "client"),
                {("b", "a", "policy"): 20.0},
            )
            reached(
                "lr_lag_entries",
                ("site", "destination", "client"),
                {("a", "b", "policy"): 0.0, ("a", "c", "policy"): 20.0, ("a", "d", "policy"): 20.0},
            )
            reached("lr_backpressure", ("site", "client"), {("a", "policy"): 1.0})
            memory = prom.values('process_resident_memory_bytes{job="lr"}', "site")
            assert set(memory) == {("a",), ("b",)} and min(memory.values()) > 1e6, memory

            # Every rule of alerts.yml is loaded and evaluates without error.
            def evaluated() -> dict[str, dict[str, Any]]:
                groups = prom.api("rules")["groups"]
                rules = {r["name"]: r for g in groups for r in g["rules"]}
                return rules if all(r["lastEvaluation"] > "0001" for r in rules.values()) else {}

            rules = wait_for(evaluated, 60, what="every rule evaluated once")
            assert set(rules) == {r["alert"] for r in alert_rules()}
            assert {n: (r["health"], r.get("lastError", "")) for n, r in rules.items()} == {
                n: ("ok", "") for n in rules
            }

            # The sessions to c and d fail; backpressure is on: those alerts and no other.
            def alerts() -> set[tuple[str, str, str]]:
                return {
                    (a["labels"]["alertname"], a["labels"]["site"], a["state"])
                    for a in prom.api("alerts")["alerts"]
                }

            wait_for(
                lambda: (
                    {(n, s) for n, s, _ in alerts()}
                    == {("LrBackpressureOn", "a"), ("LrSessionErrors", "a")}
                ),
                60,
                what="LrBackpressureOn and LrSessionErrors for site a",
                detail=lambda: prom.api("alerts"),
            )
            assert {state for _, _, state in alerts()} <= {"pending", "firing"}
            (bp,) = [
                a
                for a in prom.api("alerts")["alerts"]
                if a["labels"]["alertname"] == "LrBackpressureOn"
            ]
            assert (bp["labels"]["client"], bp["labels"]["severity"]) == ("policy", "critical")
            assert bp["annotations"]["summary"] == "backpressure on for client policy"

            # Every dashboard query runs; the panels of this state show it.
            for expr in dashboard_queries():
                prom.query(substituted(expr))
            by_title = {p["title"]: p["targets"] for p in panels(dashboard())}

            def panel(title: str, *labels: str) -> set[tuple[str, ...]]:
                return {
                    key
                    for target in by_title[title]
                    for key in prom.values(substituted(target["expr"]), *labels)
                }

            lag = "Send lag: age of the oldest unacknowledged entry"
            assert panel(lag, "destination", "client") == {
                ("b", "policy"),
                ("c", "policy"),
                ("d", "policy"),
            }
            shipped = "Entries shipped per second"
            wait_for(lambda: ("b", "policy") in panel(shipped, "destination", "client"), 30)
            applied = "Entries applied per second (as a sink)"
            wait_for(lambda: ("a", "policy") in panel(applied, "source", "client"), 30)
            assert panel("Backpressure", "client") == {("policy",)}
            assert len(panel("Resident memory", "instance")) == 2
            errors = "Stream errors per second, by kind"
            assert panel(errors, "kind") >= {("TransportError",)}
            # b runs no subscriber: what it received waits for the listener.
            waiting = "Sink: entries waiting for the listener"
            wait_for(lambda: panel(waiting, "source", "client") == {("a", "policy")}, 30)
    finally:
        codes = stop_all(servers)
        for st in stores.values():
            st.engine.dispose()
    assert codes == [0, 0], [s.log() for s in servers]
