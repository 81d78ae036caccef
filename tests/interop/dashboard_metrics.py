#!/usr/bin/python3
"""Check that contrib/grafana/sluice-dashboard.json queries only metrics the server exports.

Usage:
    dashboard_metrics.py DASHBOARD_JSON SCRAPE_FILE [--optional NAME ...] [--require-all]
                         [--promtool PROMTOOL] [--no-syntax-check]

CI runs it on a scrape of `sluice serve --metrics` (OpenMetrics text saved with curl). It
collects the PromQL of every panel target and every query-type template variable, takes the
sluice_* names out of them, and fails, listing each missing name with the panels using it,
when one is not a sample name in the scrape: a renamed or dropped metric then breaks the
build instead of leaving an empty panel. Names are compared as the scrape spells its
samples, so a counter is sluice_x_total and a histogram's series are sluice_x_bucket,
sluice_x_sum and sluice_x_count (the parser's family names drop those suffixes; a panel
querying the bare family name of a histogram gets no data, and is reported).

Some series exist only after an event: sluice_scrub_last_end_timestamp_seconds appears once
a scrub has run to its end. Those are optional by default (reported, not failed); pass
--require-all on a scrape taken after a scrub. It also fails when the dashboard has no
queries, a panel has none, or a panel names a fixed data source instead of the templated
one, and (with promtool, Debian package prometheus) checks that every query parses as PromQL.
Needs /usr/bin/python3 with python3-prometheus-client.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Series the server leaves out until something has happened; see the module docstring.
OPTIONAL_BY_DEFAULT = {"sluice_scrub_last_end_timestamp_seconds"}
# Panels that only show text or links and have no queries to check.
NO_QUERY_PANELS = {"row", "text", "news", "dashlist", "alertlist", "annolist"}
NAME = re.compile(r"(?<![A-Za-z0-9_:])sluice_[a-z0-9_]+")


def fail(msg):
    print(f"dashboard_metrics: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


try:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
except ImportError:
    fail("python3-prometheus-client is missing: apt-get install python3-prometheus-client "
         "(and run this with /usr/bin/python3, Debian's)")


def scrape_names(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        fail(f"cannot read the scrape {path}: {e}")
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError and friends, with the bad line
        fail(f"{path} is not a valid OpenMetrics scrape ({e}); save it with "
             "`curl -s http://ADDR/metrics > FILE` from `sluice serve --metrics ADDR`")
    names = {s.name for fam in families for s in fam.samples}
    if not names:
        fail(f"{path} holds no samples")
    return names


def walk_panels(panels):
    for p in panels or []:
        yield p
        # A collapsed row keeps its panels inside itself.
        yield from walk_panels(p.get("panels"))


def uses_fixed_datasource(ds):
    # A dashboard exported with a concrete uid works only on the Grafana it came from.
    if isinstance(ds, dict):
        uid = ds.get("uid")
        return uid is not None and not str(uid).startswith("$") and not str(uid).startswith("-- ")
    return isinstance(ds, str) and not ds.startswith("$") and not ds.startswith("-- ")


def variable_query(v):
    """The PromQL inside a query variable (label_values(SELECTOR, label) and the like)."""
    q = v.get("query")
    if isinstance(q, dict):
        q = q.get("query")
    q = (q or v.get("definition") or "").strip()
    m = re.fullmatch(r"(?:label_values|query_result)\((.*?)(?:,\s*[A-Za-z_][A-Za-z0-9_]*)?\)", q,
                     re.S)
    if m:
        return m.group(1).strip() or None
    if re.fullmatch(r"(?:label_names|metrics|label_values)\(.*\)", q, re.S):
        return None  # no selector to check
    return q or None


def collect(dash):
    """[(where, expr)] for every query, and the problems found on the way."""
    queries, problems = [], []
    panels = list(walk_panels(dash.get("panels")))
    for p in panels:
        ptype = p.get("type", "?")
        if ptype in NO_QUERY_PANELS or "libraryPanel" in p:
            continue
        where = f"panel {p.get('id')} {p.get('title', '')!r}"
        if uses_fixed_datasource(p.get("datasource")):
            problems.append(f"{where} uses the fixed data source {p['datasource']}; use the "
                            "${datasource} variable")
        exprs = []
        for t in p.get("targets") or []:
            if uses_fixed_datasource(t.get("datasource")):
                problems.append(f"{where}, target {t.get('refId')} uses the fixed data source "
                                f"{t['datasource']}; use the ${{datasource}} variable")
            if (t.get("expr") or "").strip():
                exprs.append(t["expr"])
        if not exprs:
            problems.append(f"{where} ({ptype}) has no query")
        queries += [(where, e) for e in exprs]
    for v in (dash.get("templating") or {}).get("list") or []:
        if v.get("type") == "query":
            q = variable_query(v)
            if q:
                queries.append((f"variable ${v.get('name')}", q))
    return queries, problems, len(panels)


def grafana_free(expr):
    """EXPR with Grafana's variables replaced by values PromQL accepts, for the syntax check."""
    expr = re.sub(r"\$\{?__(?:rate_interval|interval|range)\}?", "5m", expr)
    expr = re.sub(r"\$\{?__(?:interval_ms|range_s|range_ms)\}?", "300", expr)
    # Every dashboard variable here stands in a label matcher's regex.
    return re.sub(r"\$\{[A-Za-z0-9_]+(?::[A-Za-z]+)?\}|\$[A-Za-z_][A-Za-z0-9_]*", ".*", expr)


def syntax_check(queries, promtool):
    """Parse every query with promtool, as the expressions of recording rules."""
    def run(items):
        rules = {"groups": [{"name": "dashboard", "rules": [
            {"record": f"dashboard:query_{i}", "expr": grafana_free(e)}
            for i, (_, e) in enumerate(items)]}]}
        with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
            json.dump(rules, f)  # JSON is YAML, and promtool reads it as such
        try:
            r = subprocess.run([promtool, "check", "rules", f.name], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        finally:
            os.unlink(f.name)
        return r.returncode == 0, r.stdout.strip()

    ok, _ = run(queries)
    if ok:
        return []
    # Name the queries that do not parse, one promtool run each.
    bad = []
    for where, e in queries:
        ok, out = run([(where, e)])
        if not ok:
            bad.append(f"{where}: {e}\n    {out.splitlines()[-1] if out else 'promtool failed'}")
    return bad or ["promtool check rules failed on the queries together but on none alone"]


def main():
    ap = argparse.ArgumentParser(description="Check a Grafana dashboard's metric names against "
                                             "a sluice scrape.")
    ap.add_argument("dashboard", help="the dashboard JSON (contrib/grafana/sluice-dashboard.json)")
    ap.add_argument("scrape", help="OpenMetrics text saved from `sluice serve --metrics` (/metrics)")
    ap.add_argument("--optional", action="append", default=[], metavar="NAME",
                    help="a name that may be missing from the scrape (reported, not failed)")
    ap.add_argument("--require-all", action="store_true",
                    help="treat no name as optional, not even " + ", ".join(OPTIONAL_BY_DEFAULT))
    ap.add_argument("--promtool", default="promtool", help="promtool binary (default: on PATH)")
    ap.add_argument("--no-syntax-check", action="store_true",
                    help="do not parse the queries with promtool")
    args = ap.parse_args()

    try:
        with open(args.dashboard, encoding="utf-8") as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"cannot load the dashboard {args.dashboard}: {e}")
    present = scrape_names(args.scrape)
    optional = set(args.optional) | (set() if args.require_all else OPTIONAL_BY_DEFAULT)

    queries, problems, n_panels = collect(dash)
    if not queries:
        fail(f"{args.dashboard} has no queries (no panel target has an expr)")
    users = {}
    for where, e in queries:
        for name in NAME.findall(e):
            users.setdefault(name, set()).add(where)
    if not users:
        problems.append("no query names a sluice_* metric")
    missing = {n: w for n, w in users.items() if n not in present and n not in optional}
    absent_optional = sorted(n for n in users if n not in present and n in optional)
    for name in sorted(missing):
        hint = ""
        for suffix in ("_total", "_bucket"):
            if name + suffix in present:
                hint = f" (the scrape has {name + suffix})"
        problems.append(f"{name} is not in {args.scrape}{hint}; used by "
                        + "; ".join(sorted(missing[name])))

    if not args.no_syntax_check:
        promtool = shutil.which(args.promtool)
        if not promtool:
            fail(f"{args.promtool} not found: apt-get install prometheus, pass --promtool PATH, "
                 "or --no-syntax-check")
        problems += [f"query does not parse: {b}" for b in syntax_check(queries, promtool)]

    if problems:
        print(f"dashboard_metrics: FAIL: {args.dashboard} against {args.scrape}:", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        if missing:
            print("  A missing name was renamed or dropped in the server (crates/cli/src/"
                  "metrics.rs), or the dashboard has a typo: fix whichever is wrong.",
                  file=sys.stderr)
        sys.exit(1)
    note = f"; optional, not in this scrape: {', '.join(absent_optional)}" if absent_optional else ""
    parsed = "" if args.no_syntax_check else ", all parse"
    print(f"dashboard_metrics: OK: {n_panels} panels, {len(queries)} queries{parsed}; "
          f"{len(users) - len(absent_optional)} of their {len(users)} sluice metric names in "
          f"{args.scrape}{note}")


if __name__ == "__main__":
    main()
