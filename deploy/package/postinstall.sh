#!/bin/sh
# Tell a running systemd about the unit; the service is not enabled nor
# started: it needs SSEGATE_UPSTREAM in /etc/ssegate/ssegate.env first.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
