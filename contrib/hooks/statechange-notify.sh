#!/bin/sh
# sluice event hook: mail root when a leaf of a pool leaves ONLINE (DEGRADED, FAULTED,
# OFFLINE) or comes back, with the pool's status. Install: copy into the directory given to
# `sluice serve --event-hook`, owned by root, mode 0755. A hook sees only the event's
# ZEVENT_* variables, PATH, SLUICE and TZ: to mail someone else, edit `to` below.
to=root
subject="sluice: pool $ZEVENT_POOL: $ZEVENT_VDEV_PATH is $ZEVENT_STATE (was $ZEVENT_PREVIOUS)"
body="$(printf '%s\n%s\n\n' "$subject" "${ZEVENT_REASON:+reason: $ZEVENT_REASON}"; "$SLUICE" pool status "$ZEVENT_POOL" 2>&1)"
if command -v mail >/dev/null 2>&1; then
    printf '%s\n' "$body" | mail -s "$subject" "$to"
else
    # No mailer: the line goes to the server's log, which shows this hook's output.
    echo "$subject (no mail command installed)"
fi
