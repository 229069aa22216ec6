#!/bin/sh
# The secret files docker-compose.yml mounts (its `secrets:`), made once:
#
#   deploy/make-secrets.sh [DIR]      # DIR: $SECRETS_DIR, else secrets/ next to docker-compose.yml
#
#   secret_keys          the key ring sealing targets' signing secrets at rest, `id:base64(32 bytes)`
#   database_password    the cronhook database user's password (PostgreSQL's and the services')
#   bootstrap_api_key    an API key of tenant "default", ensured at start-up
#   admin_api_key        the bearer key of the operator endpoints (/v1/cluster)
#
# Idempotent: a missing file is generated, an existing one is NEVER overwritten or changed, so
# running it again is always safe. Replace a value by editing its file (rotating the key ring:
# README "Secrets at rest"; the new key goes first, the old one stays after it until resealed).
#
# BACK UP secret_keys, apart from the database's backups: the stored signing secrets can only be
# opened with it; without it they are lost for good, and a restored database is no use.
#
# Who may read them: the image runs as uid/gid 10001 (Dockerfile UID/GID), and compose v1 mounts
# file secrets as they are on the host (owner and mode included). Run as root, the files are
# made mode 0640, group 10001 (the directory 0750): readable by the containers and by root only.
# Run as another user, who cannot give files to group 10001, they are made 0644 in a 0755
# directory, readable by every local user: a warning says so; fix it with
#   sudo chgrp -R 10001 DIR && sudo chmod 0750 DIR && sudo chmod 0640 DIR/*
# (CONTAINER_GID=... if the image was built with another GID.)
set -eu

root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-${SECRETS_DIR:-$root/secrets}}"
gid="${CONTAINER_GID:-10001}"

# Random bytes as base64 without newlines, and without the characters a shell or URL would mind.
token() {
	head -c "$1" /dev/urandom | base64 | tr -d '\n+/='
}

token_line() {
	printf '%s\n' "$(token "$1")"
}

key_entry() {
	id="k$(head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n')"
	printf '%s:%s\n' "$id" "$(head -c 32 /dev/urandom | base64 | tr -d '\n')"
}

umask 077
mkdir -p "$dir"
shared=no
# (A directory made by another user keeps its owner and mode.)
if chgrp "$gid" "$dir" 2>/dev/null; then
	chmod 0750 "$dir"
	shared=group
else
	chmod 0755 "$dir" 2>/dev/null || true
fi

created=""
# `new_secret NAME COMMAND...` writes COMMAND's output the file next to its final name, then links it in place: the link fails
# if the file exists (made meanwhile by another run), so nothing is ever overwritten, and a
# file is never seen half-written.
new_secret() {
	name="$1"
	shift
	target="$dir/$name"
	if [ -e "$target" ]; then
		echo "kept     $target"
		return
	fi
	tmp="$(mktemp "$dir/.$name.XXXXXX")"
	"$@" >"$tmp"
	if [ "$shared" = group ]; then
		chgrp "$gid" "$tmp"
		chmod 0640 "$tmp"
	else
		chmod 0644 "$tmp"
	fi
	if ln "$tmp" "$target" 2>/dev/null; then
		echo "created  $target"
		created="$created $name"
	else
		echo "kept     $target"
	fi
	rm -f "$tmp"
}

new_secret secret_keys key_entry
new_secret database_password token_line 30
new_secret bootstrap_api_key token_line 32
new_secret admin_api_key token_line 32

case " $created " in
*" secret_keys "*)
	echo
	echo "NEW KEY RING: back up $dir/secret_keys now, apart from the database's backups."
	echo "Without it the targets' signing secrets stored in the database cannot be opened."
	;;
esac
if [ "$shared" != group ]; then
	echo
	echo "WARNING: $(id -un) cannot give files to group $gid (the containers' user), so the"
	echo "secrets in $dir are readable by EVERY local user (mode 0644). To fix:"
	echo "  sudo chgrp -R $gid '$dir' && sudo chmod 0750 '$dir' && sudo chmod 0640 '$dir'/*"
fi
