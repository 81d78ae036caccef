#!/bin/sh
# sluice event hook: POST every event as JSON to a webhook (Slack-compatible `text` field,
# plus the event's own fields). Edit URL below; install owned by root, mode 0755, in the
# directory given to `sluice serve --event-hook`. Error bursts and state changes are what
# most people want: rename it statechange-webhook.sh to send only state changes.
URL="https://hooks.example.com/sluice"
text="sluice: $ZEVENT_CLASS pool=$ZEVENT_POOL${ZEVENT_VDEV_PATH:+ vdev=$ZEVENT_VDEV_PATH}${ZEVENT_STATE:+ state=$ZEVENT_STATE}"
json=$(printf '{"text":"%s","eid":%s,"class":"%s","time":"%s","pool":"%s","vdev":"%s"}' \
    "$text" "$ZEVENT_EID" "$ZEVENT_CLASS" "$ZEVENT_TIME" "$ZEVENT_POOL" "${ZEVENT_VDEV_PATH:-}")
exec curl --silent --show-error --fail --max-time 20 \
    -H 'Content-Type: application/json' --data "$json" "$URL"
