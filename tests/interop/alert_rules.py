#!/usr/bin/python3
"""Unit-test contrib/prometheus/sluice-alerts.yml against a real scrape, with promtool.

Usage:
    alert_rules.py SCRAPE_FILE RULES_FILE OUT_TEST_YAML [--expect-leaf PATH ...]
                   [--expect-state STATE] [--promtool PROMTOOL] [--no-run]

CI (tests/interop/events.sh) scrapes `sluice serve --metrics` while one leaf is DEGRADED and
runs this with --expect-leaf naming that leaf. The script writes OUT_TEST_YAML, a
`promtool test rules` file with two test groups, and runs promtool on it:

  * "scrape": every sample of SCRAPE_FILE becomes an input series held at its scraped value
    for 30 minutes (so counters do not move and rate-based alerts stay quiet). At 10m the
    leaf-state alert must fire for exactly the expected leaves, with the labels and
    annotations the rules render, and SluicePoolSuspended, SluiceServerDown and the other
    leaf-state alert must not fire. This ties the rules to the metric and label names the
    server really exports.
  * "synthetic": hand-made series that drive every alert in the rules file, each to fire
    or to stay quiet on purpose, so the PromQL itself (windows, thresholds, `unless`) is
    tested, not only its names.

promtool compares annotations exactly, so the expected ones are rendered here from the
rules file's own templates; the renderer knows only the template forms the rules use
($labels.NAME, $value | humanizePercentage, $value | printf "%.Nf") and refuses others.

Histograms are included: their _bucket (with `le`), _sum and _count samples become series as
the scrape names them. `_created` samples are skipped: Prometheus does not store them as
series. Needs /usr/bin/python3 with python3-prometheus-client and python3-yaml, and promtool
(Debian package prometheus).
"""

import argparse
import math
import os
import re
import shutil
import subprocess
import sys

GROUP = "sluice"
# The alert a leaf in a given state raises (the rules split FAULTED off so it can page).
LEAF_ALERTS = {"FAULTED": "SluiceLeafFaulted"}
LEAF_ALERT_OTHER = "SluiceLeafNotOnline"
LEAF_STATES = ("ONLINE", "DEGRADED", "FAULTED", "OFFLINE")

# Prometheus adds these target labels to every scraped series; the rules match on them
# (`unless on(job, instance, pool)`), so the test series carry them as a real scrape would.
JOB = "sluice"
INSTANCE = "sluice-under-test:9556"

# Series the server leaves out until something has happened: the last scrub's end appears
# once a scrub has run to its end (SluiceScrubOverdue handles its absence on purpose).
OPTIONAL_NAMES = {"sluice_scrub_last_end_timestamp_seconds", "sluice_spare_state"}
NAME = re.compile(r"(?<![A-Za-z0-9_:])sluice_[a-z0-9_]+")

# The scrape's samples are held for SCRAPE_STEPS minutes and checked at SCRAPE_EVAL, after
# the 1m `for:` of the leaf alerts. The synthetic series run longer: SluiceScrubOverdue has
# `for: 1h`, so everything there is checked at SYNTH_EVAL_MIN.
SCRAPE_STEPS = 30
SCRAPE_EVAL = "10m"
SYNTH_STEPS = 100
SYNTH_EVAL_MIN = 70


def fail(msg):
    print(f"alert_rules: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


try:
    import yaml
except ImportError:
    fail("python3-yaml is missing: apt-get install python3-yaml (scripts/test should install it)")
try:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
except ImportError:
    fail("python3-prometheus-client is missing: apt-get install python3-prometheus-client "
         "(and run this with /usr/bin/python3, Debian's)")


# --- series -------------------------------------------------------------------------------

def escape_label_value(v):
    # PromQL string escapes: a leaf path may hold a backslash, a quote or even a newline.
    return (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            .replace("\r", "\\r").replace("\t", "\\t"))


def series_string(name, labels):
    inner = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def held(value, steps):
    """A promtool value string holding VALUE for STEPS intervals after the first sample.

    `a+0xN` rather than the `axN` shorthand: promtool accepts NaN and Inf only in the former.
    """
    if math.isnan(value):
        text = "NaN"
    elif math.isinf(value):
        text = "+Inf" if value > 0 else "-Inf"
    else:
        text = repr(float(value))
    return f"{text}+0x{steps}"


def target_labels(labels, job=JOB, instance=INSTANCE):
    if "job" in labels or "instance" in labels:
        fail(f"a sample already has a job or instance label ({labels}): Prometheus would rename "
             "it to exported_*, which this test does not model")
    return {**labels, "job": job, "instance": instance}


# --- the scrape ---------------------------------------------------------------------------

def read_scrape(path):
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
    samples = []
    for fam in families:
        for s in fam.samples:
            # Counters and histograms may carry NAME_created: not a series in Prometheus.
            if s.name == fam.name + "_created":
                continue
            samples.append((s.name, dict(s.labels), float(s.value)))
    if not samples:
        fail(f"{path} holds no samples")
    return samples


def leaf_states(samples):
    """{leaf: (labels of its state series minus `state`, the state at 1 or None)}."""
    leaves = {}
    for name, labels, value in samples:
        if name != "sluice_leaf_state":
            continue
        missing = {"pool", "vdev", "leaf", "state"} - set(labels)
        if missing:
            fail(f"a sluice_leaf_state sample lacks the labels {sorted(missing)} the rules and "
                 f"this test rely on: {labels}")
        base = {k: v for k, v in labels.items() if k != "state"}
        entry = leaves.setdefault(labels["leaf"], [base, None])
        if value == 1:
            entry[1] = labels["state"]
    return {leaf: (base, state) for leaf, (base, state) in leaves.items()}


# --- rules and their templates ------------------------------------------------------------

def read_rules(path):
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        fail(f"cannot load the rules {path}: {e}")
    groups = [g for g in (doc or {}).get("groups", []) if g.get("name") == GROUP]
    if len(groups) != 1:
        fail(f"{path} has no rule group named {GROUP!r} (or more than one)")
    return [r for r in groups[0].get("rules", []) if "alert" in r]


def check_names(rules, samples, scrape_path):
    """Fail when a rule queries a sluice_* name the scrape lacks: it could never fire."""
    present = {name for name, _, _ in samples}
    missing = {}
    for r in rules:
        for name in NAME.findall(str(r.get("expr", ""))):
            if name not in present and name not in OPTIONAL_NAMES:
                missing.setdefault(name, set()).add(r["alert"])
    if missing:
        fail(f"the rules query metrics {scrape_path} does not have, so those alerts could never "
             "fire: " + "; ".join(f"{n} (in {', '.join(sorted(a))})" for n, a in
                                  sorted(missing.items()))
             + ". Renamed or dropped in the server (crates/cli/src/metrics.rs), or a typo in "
             "the rules: fix whichever is wrong")


def rule_for(rules, alertname, severity=None):
    found = [r for r in rules if r["alert"] == alertname
             and (severity is None or (r.get("labels") or {}).get("severity") == severity)]
    if len(found) != 1:
        what = alertname + (f" with severity {severity}" if severity else "")
        fail(f"the rules have {len(found)} alerting rules {what}, this test expects one; "
             "if the rules were renamed or split, update the expectations in this script")
    return found[0]


ACTION = re.compile(r"\{\{(.*?)\}\}", re.S)
PRINTF = re.compile(r'^\$value \| printf "(%\.\d+[fg])"$')


def render(template, labels, value, where):
    """Render TEMPLATE as Prometheus would for an alert with LABELS and VALUE.

    Only the forms the rules use: Go's float formatting differs from Python's elsewhere (a
    bare $value prints as %v), so anything else is refused rather than guessed.
    """
    def action(m):
        body = m.group(1)
        if body.startswith("-") or body.endswith("-"):
            fail(f"{where}: whitespace-trimming template {{{{{body}}}}} is not supported here")
        body = body.strip()
        if body.startswith("$labels."):
            name = body[len("$labels."):]
            if name not in labels:
                fail(f"{where}: the template uses $labels.{name}, which the alert does not have "
                     f"(labels: {sorted(labels)})")
            return labels[name]
        if body == "$value | humanizePercentage":
            return "%.4g%%" % (value * 100)  # Prometheus: fmt.Sprintf("%.4g%%", v*100)
        m2 = PRINTF.match(body)
        if m2:
            return m2.group(1) % value
        fail(f"{where}: this script cannot render the template {{{{ {body} }}}}; use one of "
             '$labels.NAME, $value | humanizePercentage, $value | printf "%.Nf", or teach '
             "render() the new form")
    return ACTION.sub(action, template)


def expected_alert(rule, labels, value):
    """The exp_labels and exp_annotations of one alert RULE raises for a series."""
    where = f"alert {rule['alert']}"
    lab = dict(labels)
    lab.pop("__name__", None)  # Prometheus drops the metric name from alert labels
    for k, t in (rule.get("labels") or {}).items():
        lab[k] = render(str(t), labels, value, f"{where}, label {k}")
    # $labels in annotations are the series' labels, without the rule's own (Prometheus).
    ann = {k: render(str(t), labels, value, f"{where}, annotation {k}")
           for k, t in (rule.get("annotations") or {}).items()}
    return {"exp_labels": lab, "exp_annotations": ann}


def check(alertname, eval_time, alerts):
    return {"eval_time": eval_time, "alertname": alertname, "exp_alerts": alerts}


# --- test groups --------------------------------------------------------------------------

def scrape_group(samples, rules, expect_leaves, expect_state, scrape_path):
    leaves = leaf_states(samples)
    if not leaves:
        fail(f"{scrape_path} has no sluice_leaf_state samples: not a sluice scrape, or from a "
             "server older than the leaf-state metric")
    for leaf in expect_leaves:
        if leaf not in leaves:
            fail(f"--expect-leaf {leaf}: no such leaf in {scrape_path}; its leaves are: "
                 + ", ".join(sorted(leaves)))
        state = leaves[leaf][1]
        if state != expect_state:
            fail(f"the scrape shows leaf {leaf} as {state}, not {expect_state}: scraped before "
                 "the leaf changed state? (wait for `sluice pool status` to show it first)")
    others = {leaf: s for leaf, (_, s) in leaves.items()
              if leaf not in expect_leaves and s != "ONLINE"}
    if others:
        fail(f"the scrape shows other leaves not ONLINE: {others}; name each with --expect-leaf "
             "(all with the same --expect-state) or scrape when only the expected ones are")
    suspended = [l.get("pool") for n, l, v in samples if n == "sluice_pool_suspended" and v != 0]
    if suspended:
        fail(f"the scrape shows pool(s) {suspended} suspended, which this test expects not to be")

    series = [{"series": series_string(n, target_labels(l)), "values": held(v, SCRAPE_STEPS)}
              for n, l, v in samples]
    series.append({"series": series_string("up", target_labels({})),
                   "values": held(1, SCRAPE_STEPS)})

    fired = LEAF_ALERTS.get(expect_state, LEAF_ALERT_OTHER)
    leaf_rule = rule_for(rules, fired)
    expected = [expected_alert(leaf_rule,
                               target_labels({**leaves[leaf][0], "state": expect_state}), 1.0)
                for leaf in expect_leaves]
    tests = [check(fired, SCRAPE_EVAL, expected)]
    for quiet in sorted({LEAF_ALERT_OTHER, *LEAF_ALERTS.values()} - {fired}):
        tests.append(check(quiet, SCRAPE_EVAL, []))
    tests.append(check("SluicePoolSuspended", SCRAPE_EVAL, []))
    tests.append(check("SluiceServerDown", SCRAPE_EVAL, []))
    return {"name": f"scrape {os.path.basename(scrape_path)}", "interval": "1m",
            "input_series": series, "alert_rule_test": tests}


def synthetic_group(rules):
    """Series built to make each alert fire (or not) at SYNTH_EVAL_MIN minutes."""
    series = []
    t_eval = SYNTH_EVAL_MIN * 60.0  # promtool's clock starts at the Unix epoch

    def add(name, labels, values):
        series.append({"series": series_string(name, target_labels(labels)), "values": values})

    def const(v):
        return held(v, SYNTH_STEPS)

    rising = f"0+1x{SYNTH_STEPS}"  # one more each minute: increase over 10m is 10
    day = 86400.0

    # Pool tank: one leaf in each state, errors rising on two, full, suspended, scrubbed 36
    # days before the clock's start.
    tank_leaves = [("mirror-0", "/dev/a", "FAULTED"), ("mirror-0", "/dev/d", "ONLINE"),
                   ("mirror-1", "/dev/b", "DEGRADED"), ("mirror-1", "/dev/e", "ONLINE"),
                   ("log-mirror-2", "/dev/c", "OFFLINE"), ("log-mirror-2", "/dev/f", "ONLINE")]
    for vdev, leaf, state in tank_leaves:
        base = {"pool": "tank", "vdev": vdev, "leaf": leaf}
        for s in LEAF_STATES:
            add("sluice_leaf_state", {**base, "state": s}, const(1 if s == state else 0))
        for kind in ("read", "write", "flush", "checksum"):
            if (leaf, kind) in (("/dev/a", "read"), ("/dev/b", "checksum")):
                values = rising
            elif (leaf, kind) == ("/dev/d", "read"):
                values = const(5)  # errors long ago, none since: quiet
            else:
                values = const(0)
            add("sluice_leaf_errors_total", {**base, "kind": kind}, values)

    # (pool, allocated of 1000, suspended, last scrub end or None, uptime, scrub running)
    pools = [("tank", 950, 1, -36 * day, 40 * day, 0),   # full (both severities), overdue
             ("calm", 850, 0, 0.0, 40 * day, 0),          # 85%: warning; scrubbed just now
             ("fresh", 100, 0, None, 40 * day, 0),        # never scrubbed in 40 days
             ("young", 0, 0, None, 1 * day, 0),           # never scrubbed, up 1 day: quiet
             ("busy", 0, 0, -36 * day, 40 * day, 1)]      # overdue but scrubbing: quiet
    for pool, alloc, susp, scrubbed, uptime, running in pools:
        p = {"pool": pool}
        add("sluice_pool_size_bytes", p, const(1000))
        add("sluice_pool_allocated_bytes", p, const(alloc))
        add("sluice_pool_free_bytes", p, const(1000 - alloc))
        add("sluice_pool_suspended", p, const(susp))
        add("sluice_pool_uptime_seconds", p, f"{uptime!r}+60x{SYNTH_STEPS}")
        if scrubbed is not None:
            add("sluice_scrub_last_end_timestamp_seconds", p, const(scrubbed))
        add("sluice_scan_active", {**p, "func": "scrub"}, const(running))
        add("sluice_scan_active", {**p, "func": "resilver"}, const(0))

    # Pool tank's spares: one in use, one available.
    for spare, state in (("/dev/s", "INUSE"), ("/dev/t", "AVAIL")):
        for s in ("AVAIL", "INUSE", "UNAVAIL"):
            add("sluice_spare_state", {"pool": "tank", "spare": spare, "state": s},
                const(1 if s == state else 0))

    series.append({"series": series_string("up", target_labels({})), "values": const(1)})
    series.append({"series": series_string("up", {"job": JOB, "instance": "gone:9556"}),
                   "values": const(0)})
    # Not a sluice job: SluiceServerDown must leave it to other alerts.
    series.append({"series": series_string("up", {"job": "node", "instance": "gone:9100"}),
                   "values": const(0)})

    def leaf_labels(vdev, leaf, **extra):
        return target_labels({"pool": "tank", "vdev": vdev, "leaf": leaf, **extra})

    def pool_labels(pool):
        return target_labels({"pool": pool})

    ev = f"{SYNTH_EVAL_MIN}m"

    def exp(name, labels, value, severity=None):
        return expected_alert(rule_for(rules, name, severity), labels, value)

    tests = [
        check("SluiceLeafFaulted", ev, [
            exp("SluiceLeafFaulted", leaf_labels("mirror-0", "/dev/a", state="FAULTED"), 1.0)]),
        check("SluiceLeafNotOnline", ev, [
            exp("SluiceLeafNotOnline", leaf_labels("mirror-1", "/dev/b", state="DEGRADED"), 1.0),
            exp("SluiceLeafNotOnline", leaf_labels("log-mirror-2", "/dev/c", state="OFFLINE"),
                1.0)]),
        check("SluiceChecksumErrorsRising", ev, [
            exp("SluiceChecksumErrorsRising",
                leaf_labels("mirror-1", "/dev/b", kind="checksum"), 10.0)]),
        check("SluiceIoErrorsRising", ev, [
            exp("SluiceIoErrorsRising", leaf_labels("mirror-0", "/dev/a", kind="read"), 10.0)]),
        check("SluicePoolNearlyFull", ev, [
            exp("SluicePoolNearlyFull", pool_labels("tank"), 950 / 1000, "warning"),
            exp("SluicePoolNearlyFull", pool_labels("tank"), 950 / 1000, "critical"),
            exp("SluicePoolNearlyFull", pool_labels("calm"), 850 / 1000, "warning")]),
        check("SluicePoolSuspended", ev, [
            exp("SluicePoolSuspended", pool_labels("tank"), 1.0)]),
        check("SluiceScrubOverdue", ev, [
            exp("SluiceScrubOverdue", pool_labels("tank"), (t_eval + 36 * day) / day),
            exp("SluiceScrubOverdue", pool_labels("fresh"), (40 * day + t_eval) / day)]),
        check("SluiceSpareInUse", ev, [
            exp("SluiceSpareInUse",
                target_labels({"pool": "tank", "spare": "/dev/s", "state": "INUSE"}), 1.0)]),
        check("SluiceServerDown", ev, [
            exp("SluiceServerDown", {"job": JOB, "instance": "gone:9556"}, 0.0)]),
    ]
    covered = {t["alertname"] for t in tests}
    untested = sorted({r["alert"] for r in rules} - covered)
    if untested:
        fail(f"the rules have alerts this script does not test: {untested}; add series and "
             "expectations for them to synthetic_group()")
    return {"name": "synthetic series for every alert", "interval": "1m",
            "input_series": series, "alert_rule_test": tests}


# --- main ---------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(
        description="Write a promtool rule test from a sluice scrape and run it.")
    ap.add_argument("scrape", help="OpenMetrics text saved from `sluice serve --metrics` (/metrics)")
    ap.add_argument("rules", help="the alerting rules (contrib/prometheus/sluice-alerts.yml)")
    ap.add_argument("out", help="where to write the promtool test file")
    ap.add_argument("--expect-leaf", action="append", default=[], metavar="PATH",
                    help="a leaf (its path, as the leaf label shows it) the scrape shows in "
                         "--expect-state; repeat for more. None: every leaf must be ONLINE")
    ap.add_argument("--expect-state", default="DEGRADED", choices=LEAF_STATES[1:],
                    help="the state of the expected leaves (default DEGRADED)")
    ap.add_argument("--promtool", default="promtool", help="promtool binary (default: on PATH)")
    ap.add_argument("--no-run", action="store_true", help="write the test file, do not run it")
    args = ap.parse_args()

    rules_abs = os.path.abspath(args.rules)
    rules = read_rules(rules_abs)
    samples = read_scrape(args.scrape)
    check_names(rules, samples, args.scrape)
    doc = {
        # Absolute: promtool resolves rule_files against the test file's directory.
        "rule_files": [rules_abs],
        "evaluation_interval": "1m",
        "tests": [scrape_group(samples, rules, args.expect_leaf, args.expect_state, args.scrape),
                  synthetic_group(rules)],
    }
    try:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(f"# Written by tests/interop/alert_rules.py from {os.path.abspath(args.scrape)}"
                    "; run with `promtool test rules`.\n")
            yaml.safe_dump(doc, f, sort_keys=False, allow_unicode=True, width=1 << 16)
    except OSError as e:
        fail(f"cannot write {args.out}: {e}")
    if args.no_run:
        print(f"alert_rules: wrote {args.out} (not run)")
        return

    promtool = shutil.which(args.promtool)
    if not promtool:
        fail(f"{args.promtool} not found: apt-get install prometheus, or pass --promtool PATH")
    r = subprocess.run([promtool, "test", "rules", args.out], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout)
        fail(f"`promtool test rules {args.out}` failed: the rules in {args.rules} did not alert "
             "as expected (above, per test group: exp is what this script expected from the "
             "scrape and the synthetic series, got what the rules produced). A changed metric "
             "or label name in the server, a rule edit, or a wrong --expect-leaf does this")
    if args.expect_leaf:
        leaves = f"{args.expect_state}: " + ", ".join(args.expect_leaf)
    else:
        leaves = "every leaf ONLINE"
    print(f"alert_rules: OK: promtool test rules {args.out} passed ({len(samples)} scraped "
          f"series, {leaves}; every alert exercised on synthetic series)")


if __name__ == "__main__":
    main()
