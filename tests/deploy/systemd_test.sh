#!/usr/bin/env bash
# systemd_test.sh BUILD_DIR: checks the bare-host units in deploy/systemd without a running systemd
# (this runs in containers whose pid 1 is not systemd; systemd-analyze works offline):
#   * `systemd-analyze verify` accepts both units with no message at all (it only warns about an
#     unknown key, a bad value or an unresolvable specifier, so any output fails the check); the
#     ExecStart binaries are this build's, laid out as the bundle installs them (/opt/garden/bin);
#   * the sandbox: `systemd-analyze security --offline=yes` rates tulip's exposure at most 2.0 and
#     ivy's at most 1.5 (weakening a setting fails the check);
#   * the wiring: both restart on failure but not on a flag error (exit status 2), read an
#     EnvironmentFile, get the tulip token as a credential passed to the right flag; ivy is ordered
#     after tulip and wants it;
#   * the example environment files name real flags (each TULIP_*/IVY_* variable is a flag of that
#     binary's --help) with values the binary accepts;
# and, with --self-test semantics always on, that each check fails on a known-bad edit.
set -uo pipefail
build="$(cd "$1" && pwd)"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
src="$repo/deploy/systemd"
work="$(mktemp -d /tmp/garden-systemd-test.XXXXXX)"
trap 'rm -rf "$work"' EXIT
command -v systemd-analyze >/dev/null ||
  { echo "FAIL systemd-analyze not found (Debian package systemd; scripts/install-deps.sh installs it)"; exit 1; }
declare -A BIN=([tulip]="$build/services/tulip/tulip" [ivy]="$build/services/ivy/ivy")
declare -A PREFIX=([tulip]=TULIP [ivy]=IVY)
declare -A MAX_EXPOSURE=([tulip]=20 [ivy]=15)  # tenths, as --threshold takes them

# check_units DIR: all checks over DIR/{garden-tulip,garden-ivy}.service and DIR/{tulip,ivy}.env.
# Prints "FAIL ..." per problem and "ok ..." per passed check; returns the number of problems.
check_units() {
  local dir="$1" fails=0 root="$1/root"
  bad() { echo "FAIL $*"; fails=$((fails + 1)); }
  good() { echo "ok   $*"; }
  # The paths the units name, inside a private tree: /opt/garden/bin -> this build's binaries,
  # /etc/garden -> the example files.
  mkdir -p "$root/opt/garden/bin" "$root/etc/garden"
  for b in tulip ivy; do ln -sf "${BIN[$b]}" "$root/opt/garden/bin/$b"; done
  cp "$dir"/*.env "$root/etc/garden/"
  echo "a-test-token" > "$root/etc/garden/tulip-token"
  local units=()
  for b in tulip ivy; do
    sed -e "s#/opt/garden/#$root/opt/garden/#g; s#/etc/garden/#$root/etc/garden/#g" \
      "$dir/garden-$b.service" > "$root/garden-$b.service"
    units+=("garden-$b.service")
  done
  local out
  out="$(cd "$root" && systemd-analyze verify "${units[@]}" 2>&1)"
  local rc=$?
  if [ "$rc" -ne 0 ] || [ -n "$out" ]; then bad "systemd-analyze verify (status $rc): $out"
  else good "systemd-analyze verify: ${units[*]} (no messages)"; fi

  for b in tulip ivy; do
    local u="$dir/garden-$b.service" f="$root/garden-$b.service"
    local score
    score="$(cd "$root" && systemd-analyze security --offline=yes "garden-$b.service" 2>&1 | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\).*/\1/p')"
    if (cd "$root" && systemd-analyze security --offline=yes --threshold="${MAX_EXPOSURE[$b]}" "garden-$b.service" >/dev/null 2>&1); then
      good "garden-$b: exposure $score (at most $((MAX_EXPOSURE[$b] / 10)).$((MAX_EXPOSURE[$b] % 10)))"
    else bad "garden-$b: exposure ${score:-?} is above $((MAX_EXPOSURE[$b] / 10)).$((MAX_EXPOSURE[$b] % 10))"; fi
    # The restart policy and its configuration.
    grep -qx "Restart=on-failure" "$u" || bad "garden-$b: no Restart=on-failure"
    grep -qx "RestartPreventExitStatus=2" "$u" || bad "garden-$b: restarts on a flag error (no RestartPreventExitStatus=2)"
    grep -qx "EnvironmentFile=/etc/garden/$b.env" "$u" || bad "garden-$b: no EnvironmentFile=/etc/garden/$b.env"
    grep -qx "ExecStart=/opt/garden/bin/$b" "$u" || bad "garden-$b: ExecStart is not /opt/garden/bin/$b"
    grep -qx "LoadCredential=tulip-token:/etc/garden/tulip-token" "$u" || bad "garden-$b: the tulip token is not a credential"
    local flag=TULIP_AUTH_TOKEN_FILE; [ "$b" = ivy ] && flag=IVY_TULIP_TOKEN_FILE
    grep -qx "Environment=$flag=%d/tulip-token" "$u" || bad "garden-$b: $flag is not the credential %d/tulip-token"
    # Every TULIP_*/IVY_* variable the unit or its env file sets (or shows commented out) is a flag.
    local help
    help="$("${BIN[$b]}" --help 2>&1)"
    local vars
    vars="$(cat "$u" "$dir/$b.env" | sed -n "s/^\(# \{0,1\}\)\{0,1\}\(Environment=\)\{0,1\}\(${PREFIX[$b]}_[A-Z0-9_]*\)=.*/\3/p" | sort -u)"
    local n=0
    for v in $vars; do
      local name
      name="$(tr 'A-Z_' 'a-z-' <<<"${v#"${PREFIX[$b]}"_}")"
      grep -Eq "^\s+--$name(=|\s|$)" <<<"$help" || bad "garden-$b: $v is not a $b flag (--$name)"
      n=$((n + 1))
    done
    [ "$n" -gt 0 ] || bad "garden-$b: no ${PREFIX[$b]}_* variables found"
    # The env file's values parse: run the binary with them and a flag that stops it right after
    # parsing (exit status 2 with that flag's message, not an environment variable's).
    local stop=(--depth=0) want="--depth must be"
    [ "$b" = ivy ] && stop=(--port=70000) want="--port 70000 is out of range"
    local parsed
    parsed="$(env -i $(grep -E "^${PREFIX[$b]}_" "$dir/$b.env") "${BIN[$b]}" "${stop[@]}" 2>&1)"
    if grep -qF -- "$want" <<<"$parsed" && ! grep -q "environment variable" <<<"$parsed"; then
      good "garden-$b: $b accepts $b.env's values ($n variables checked against --help)"
    else bad "garden-$b: $b rejects $b.env: $parsed"; fi
  done
  local ivy="$dir/garden-ivy.service"
  grep -Eq "^After=.*\bgarden-tulip\.service\b" "$ivy" || bad "garden-ivy is not ordered after garden-tulip"
  grep -Eq "^Wants=.*\bgarden-tulip\.service\b" "$ivy" || bad "garden-ivy does not want garden-tulip"
  grep -Eq "^(Requires|BindsTo)=.*garden-tulip" "$ivy" && bad "garden-ivy would be stopped with tulip (Requires/BindsTo)"
  return "$fails"
}

mkdir -p "$work/real"
cp "$src"/garden-tulip.service "$src"/garden-ivy.service "$src"/tulip.env "$src"/ivy.env "$work/real/"
check_units "$work/real"
real_fails=$?

# Each check must be able to fail: known-bad edits, each caught by the message given.
self_fails=0
mutate() {  # mutate NAME PATTERN SED-SCRIPT FILE
  local name="$1" expect="$2" script="$3" file="$4" d="$work/m$RANDOM$RANDOM"
  mkdir -p "$d"
  cp "$work/real"/*.service "$work/real"/*.env "$d/"
  sed -i -e "$script" "$d/$file"
  local out
  out="$(check_units "$d" 2>&1)"
  if grep "^FAIL" <<<"$out" | grep -Eq "$expect"; then echo "ok   self-test caught: $name"
  else echo "FAIL self-test missed: $name ($(grep '^FAIL' <<<"$out" | head -3 | tr '\n' ' '))"; self_fails=$((self_fails + 1)); fi
}
mutate "a misspelt key" "Unknown key 'RestarSec'" 's/^RestartSec=/RestarSec=/' garden-tulip.service
mutate "a bad value" "on-failur" 's/^Restart=on-failure/Restart=on-failur/' garden-ivy.service
mutate "a bad specifier" "Failed to resolve specifiers" 's#%d/tulip-token#%Q/tulip-token#' garden-tulip.service
mutate "no restart" "garden-tulip: no Restart=on-failure" '/^Restart=/d' garden-tulip.service
mutate "restarting on a flag error" "RestartPreventExitStatus" '/^RestartPreventExitStatus=/d' garden-ivy.service
mutate "ivy not after tulip" "not ordered after garden-tulip" 's/^After=.*/After=network-online.target/' garden-ivy.service
mutate "ivy bound to tulip" "Requires/BindsTo" 's/^Wants=\(.*\)/Wants=\1\nBindsTo=garden-tulip.service/' garden-ivy.service
mutate "a weaker sandbox" "garden-ivy: exposure .* is above" '/^\(ProtectSystem\|NoNewPrivileges\|PrivateDevices\)=/d' garden-ivy.service
mutate "a weaker tulip sandbox" "garden-tulip: exposure .* is above" '/^SystemCallFilter=/d' garden-tulip.service
mutate "the token on the wrong flag" "IVY_TULIP_TOKEN_FILE is not the credential" 's/IVY_TULIP_TOKEN_FILE/IVY_API_KEYS_FILE/' garden-ivy.service
mutate "a variable that is no flag" "TULIP_NO_SUCH_FLAG is not a tulip flag" '$a TULIP_NO_SUCH_FLAG=1' tulip.env
mutate "a value tulip refuses" "tulip rejects tulip.env" 's/^TULIP_PORT=.*/TULIP_PORT=many/' tulip.env
mutate "no environment file" "no EnvironmentFile" '/^EnvironmentFile=/d' garden-ivy.service
if [ "$real_fails" -eq 0 ] && [ "$self_fails" -eq 0 ]; then echo "systemd units: all checks passed"; exit 0; fi
echo "systemd units: $real_fails problem(s), $self_fails self-test miss(es)"
exit 1
