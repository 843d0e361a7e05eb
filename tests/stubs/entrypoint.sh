#!/bin/sh
# Entrypoint of the rgt stub host image.
#  - per-container host keys, only the missing ones (a restart keeps them; the harness deletes them
#    to simulate a recreated instance). ed25519 + ecdsa only: RSA generation (ssh-keygen -A) costs
#    1-2.5 s per start on a 2-vCPU CI box. STUB_RSA_HOSTKEY=1 runs ssh-keygen -A instead;
#  - $SSH_PUBKEY (one or more lines) -> /root/.ssh/authorized_keys (0700 / 0600);
#  - default fake GPU state and dmesg -> /run/nvidia-fake/ unless already there;
#  - exec sshd in the foreground (or exec the given command).
set -eu

if [ "${STUB_RSA_HOSTKEY:-0}" = 1 ]; then
    ssh-keygen -A >/dev/null
else
    for t in ed25519 ecdsa; do
        [ -s "/etc/ssh/ssh_host_${t}_key" ] || ssh-keygen -q -t "$t" -N '' -f "/etc/ssh/ssh_host_${t}_key"
    done
fi
mkdir -p /run/sshd
chmod 0755 /run/sshd

mkdir -p /root/.ssh
chmod 0700 /root/.ssh
touch /root/.ssh/authorized_keys
if [ -n "${SSH_PUBKEY:-}" ]; then
    printf '%s\n' "$SSH_PUBKEY" | while IFS= read -r line; do
        [ -n "$line" ] || continue
        grep -qxF "$line" /root/.ssh/authorized_keys || printf '%s\n' "$line" >> /root/.ssh/authorized_keys
    done
fi
chmod 0600 /root/.ssh/authorized_keys

mkdir -p /run/nvidia-fake
[ -e /run/nvidia-fake/state.json ] || cp /etc/nvidia-fake/state.json /run/nvidia-fake/state.json
[ -e /run/nvidia-fake/dmesg.log ] || cp /etc/nvidia-fake/dmesg.log /run/nvidia-fake/dmesg.log

if [ "$#" -gt 0 ]; then
    exec "$@"
fi
exec /usr/sbin/sshd -D -e
