# Sourced by the shell integration tests: free_port prints a port that was free a moment ago,
# random below the kernel's ephemeral range (32768-60999 by default) so that no outgoing
# connection takes it before the server binds it (tests/integration/support/harness.cc's
# freePort() says more), and never one it already printed to this shell: `$(free_port)` runs in
# a subshell, so the ports handed out are kept in a file named after the sourcing shell ($$ is
# the parent's PID in a subshell) in FREE_PORT_DIR (set it to the test's work folder, which the
# test removes; default TMPDIR).
# FREE_PORT_PREFIX: a command prefix for python3 (e.g. "env LD_LIBRARY_PATH=...", inside
# tests/deploy/bundle_test.sh's namespace where system libraries are hidden).
FREE_PORT_USED="${FREE_PORT_DIR:-${TMPDIR:-/tmp}}/garden-free-ports-$$"
: > "$FREE_PORT_USED"
free_port() {
  ${FREE_PORT_PREFIX:-} python3 -c 'import random, socket, sys
used = set(open(sys.argv[1]).read().split())
for _ in range(2000):
    p = random.randrange(20000, 32000)
    if str(p) in used:
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    open(sys.argv[1], "a").write("%d\n" % p)
    print(p)
    break' "$FREE_PORT_USED"
}
