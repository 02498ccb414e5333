#!/bin/sh
# Stop the service before its binary goes (on removal, not on upgrade).
set -e
case "$1" in
remove | purge | 0)
	if [ -d /run/systemd/system ]; then
		systemctl disable --now ssegate.service >/dev/null 2>&1 || true
	fi
	;;
esac
