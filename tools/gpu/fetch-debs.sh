#!/usr/bin/env bash
# fetch-debs.sh: owns .debs/ at the repo root, the Debian packages that let
# tools/gpu-test.sh build the full library and CLI (jansson, pcre2 8-bit,
# utf8proc, libmicrohttpd: runtime + dev) on a GPU machine that has no network and may lack them.
# Run HERE (a Debian machine with apt), before the device call, from anywhere:
#     bash tools/gpu/fetch-debs.sh
# then give the device tool carry: [".debs"]. gpu-test.sh unpacks them with
# `dpkg -x` into a private sysroot under its build folder (never into /).
# Idempotent: packages already in .debs/ at the candidate version are kept.
# Also adds /.debs/ to .git/info/exclude (untracked, local to this clone).
set -euo pipefail
cd "$(dirname "$0")/../.."
PKGS=(libjansson4 libjansson-dev libpcre2-8-0 libpcre2-dev libutf8proc2 libutf8proc-dev libmicrohttpd12 libmicrohttpd-dev)
mkdir -p .debs
if [ -d .git ]; then
    mkdir -p .git/info
    touch .git/info/exclude
    grep -qxF '/.debs/' .git/info/exclude || echo '/.debs/' >>.git/info/exclude
fi
command -v apt-get >/dev/null || { echo "fetch-debs: apt-get not found (run this on the Debian dev machine)" >&2; exit 1; }
# A candidate version for each package, else refresh the lists once.
have_candidates() {
    local p v
    for p in "${PKGS[@]}"; do
        v=$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2}')
        [ -n "$v" ] && [ "$v" != "(none)" ] || return 1
    done
}
if ! have_candidates; then
    echo "fetch-debs: apt-get update" >&2
    apt-get update -qq
fi
have_candidates || { echo "fetch-debs: no candidate for one of: ${PKGS[*]}" >&2; exit 1; }
cd .debs
for p in "${PKGS[@]}"; do
    v=$(apt-cache policy "$p" | awk '/Candidate:/ {print $2}')
    # .deb file names encode ':' of an epoch as %3a; match on name_ prefix.
    if ls "${p}_"*.deb >/dev/null 2>&1 && dpkg-deb -f "$(ls "${p}_"*.deb | head -n 1)" Version | grep -qxF "$v"; then
        continue
    fi
    rm -f "${p}_"*.deb
    apt-get download -q -o APT::Sandbox::User="$(id -un)" "$p" >/dev/null
done
n=$(ls ./*.deb | wc -l)
[ "$n" -eq ${#PKGS[@]} ] || { echo "fetch-debs: expected ${#PKGS[@]} .deb files in .debs/, found $n" >&2; exit 1; }
for d in ./*.deb; do
    printf '%-28s %-18s %s\n' "$(dpkg-deb -f "$d" Package)" "$(dpkg-deb -f "$d" Version)" "$(dpkg-deb -f "$d" Architecture)"
done
echo "fetch-debs: $(du -sh . | cut -f1) in .debs/ (carry it with the device call: carry [\".debs\"])"
